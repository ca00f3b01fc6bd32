"""A pipeline timeline from per-stage times: when each stage runs each micro-batch's forward and backward.

The cost model gives, per chunk j, p_j (forward + backward of one micro-batch, recomputation included), o_j (the
boundary j → j+1: activation forward and its gradient back), g_i per stage (once per iteration: gradient sync and
optimizer) and, for a schedule that splits the backward, w_j (its weight pass). The timeline splits p_j as
forward ≈ p_j / 3 and backward ≈ 2 p_j / 3 (`schedules.FORWARD_SHARE`) and o_j evenly between the activation send
and the gradient send, and runs each stage's operations in the schedule's order (`Schedule.order`, as torch runs
them), each as soon as its input has arrived (`schedules.simulate_order`); idle time is the bubble. The end is
each stage's gradient sync. The solver's time formulas bound this simulation from above
(tests/solve/test_schedule_bounds.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from uniap.errors import UniapError
from uniap.schedules import FORWARD_SHARE, schedule_named, simulate_order


@dataclass(frozen=True)
class Box:
    stage: int  # for sends: the sending stage of an activation, the receiving stage of a gradient (upper row)
    kind: str  # forward | backward | weight | send | send-grad | sync | bubble
    micro: int  # micro-batch index (-1 for sync and bubble)
    start: float
    end: float
    chunk: int = -1  # the chunk (global index) a forward/backward runs, under a schedule of several chunks per stage

    @property
    def duration(self) -> float:
        return self.end - self.start


KINDS = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}


def simulate(schedule: str, p, o, g, micro_batches: int, virtual_stages: int = 1, w=None) -> list[Box]:
    """Boxes of one iteration: S·c forwards and backwards (and weight passes), (S−1)·c sends each way, P syncs,
    and the bubbles, for S = len(p) chunks on P = S / virtual_stages stages (chunk j on stage j mod P)."""
    chosen = schedule_named(schedule)
    S, v = len(p), virtual_stages
    P = S // v if v >= 1 else 0
    if P < 1 or micro_batches < 1 or S % v:
        raise UniapError("a timeline needs at least one stage and one micro-batch")
    if len(o) != S - 1 or len(g) != P:
        raise UniapError(f"timeline: {S} stages (chunks) need {S - 1} boundary times and {P} sync times")
    fwd = [float(x) * FORWARD_SHARE for x in p]
    bwd = [float(x) - f for x, f in zip(p, fwd)]
    wgt = [0.0] * S if w is None else [float(x) for x in w]
    send = [float(x) for x in o]
    boxes: list[Box] = []
    free = [0.0] * P
    labelled = chosen.interleaved and v > 1
    for op in simulate_order(chosen, P, micro_batches, v, fwd, bwd, wgt, send):
        i, j = op.stage, op.chunk
        if op.start > free[i]:
            boxes.append(Box(i, "bubble", -1, free[i], op.start))
        boxes.append(Box(i, KINDS[op.kind], op.micro, op.start, op.end, j if labelled else -1))
        if op.kind == "F" and j < S - 1:
            boxes.append(Box(i, "send", op.micro, op.end, op.end + send[j] / 2))
        if op.kind in ("B", "I") and j > 0:
            boxes.append(Box(chosen.stage_of_chunk(j - 1, P), "send-grad", op.micro, op.end, op.end + send[j - 1] / 2))
        free[i] = op.end
    for i in range(P):
        boxes.append(Box(i, "sync", -1, free[i], free[i] + float(g[i])))
    return boxes


def makespan(boxes: list[Box]) -> float:
    return max((b.end for b in boxes), default=0.0)
