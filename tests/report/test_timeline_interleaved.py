"""The interleaved timeline: torch's operation order, simulated, against the cost model's formula."""

import pytest

from uniap.report.timeline import makespan, simulate
from uniap.schedules import INTERLEAVED_1F1B

interleaved_order = INTERLEAVED_1F1B.order


@pytest.mark.parametrize("P,v,c", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 4, 6)])
def test_simulated_interleaved_schedule_matches_the_formula(P, v, c):
    # balanced chunks of 1 s, free sends: the formula's (c + (P − 1)/v)·p with p = v s per stage
    S = P * v
    boxes = simulate("interleaved-1f1b", [1.0] * S, [0.0] * (S - 1), [0.0] * P, c, v)
    assert makespan(boxes) == pytest.approx((c + (P - 1) / v) * v)
    work = [b for b in boxes if b.kind in ("forward", "backward")]
    assert len(work) == 2 * S * c
    for i in range(P):  # each stage runs exactly its own chunks, in torch's order
        mine = [(b.kind[0].upper(), b.chunk, b.micro) for b in work if b.stage == i]
        assert mine == interleaved_order(i, P, c, v)
        assert {chunk % P for _, chunk, _ in mine} == {i}


def test_interleaved_order_warms_up_as_torch_does():
    # P = 4, v = 2, c = 8: stage 0 runs (v − 1)·P + 2·(P − 1) = 10 warm-up forwards, then forward/backward pairs
    ops = interleaved_order(0, 4, 8, 2)
    first_backward = next(k for k, op in enumerate(ops) if op[0] == "B")
    assert first_backward == 11
    assert ops[:5] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3), ("F", 4, 0)]
    assert interleaved_order(3, 4, 8, 2)[:5] == [("F", 3, 0), ("F", 3, 1), ("F", 3, 2), ("F", 3, 3), ("F", 7, 0)]
