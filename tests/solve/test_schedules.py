"""The schedules module against torch: each operation order is the one torch.distributed.pipelining runs, and the
zero-bubble schedule's simulated time is the closed form of its analysis on equal chunks."""

import pytest
import torch.distributed.pipelining as pipelining
from torch.distributed.pipelining import schedules as torch_schedules

from uniap.errors import UniapError
from uniap.schedules import DUALPIPE_V, INTERLEAVED_1F1B, SCHEDULES, ZERO_BUBBLE, ZERO_BUBBLE_V, Schedule, VShaped, \
    _stage_occupancy, exported_schedules, schedule_named, simulate_order

KIND = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


def uniform_makespan(schedule, P, c, v, fwd, bwd, wgt, send):
    """The simulated step (no gradient sync) when every chunk takes the same times."""
    S = P * v
    return max(r.end for r in simulate_order(schedule, P, c, v, [fwd] * S, [bwd] * S, [wgt] * S, [send] * (S - 1)))


def torch_order(cls, P: int, c: int, v: int) -> dict[int, list[tuple[str, int, int]]]:
    """torch's own per-rank actions of a multi-stage schedule, computed without process groups (the schedule's
    `_calculate_single_rank_operations` reads only these fields)."""
    self = object.__new__(cls)
    self.pp_group_size, self.n_local_stages, self._n_microbatches = P, v, c
    self.number_of_rounds = max(1, c // P)
    self.microbatches_per_round = c // self.number_of_rounds
    self.num_stages = self._num_stages = P * v
    out = {}
    for rank in range(P):
        self.rank = rank
        ops = cls._calculate_single_rank_operations(self, rank)
        # DualPipeV's overlapped forward and backward run one after the other in torch's runtime
        flat = [sub for a in ops if a is not None for sub in (a.sub_actions or (a,))]
        out[rank] = [(KIND[a.computation_type.name], a.stage_index, a.microbatch_index) for a in flat]
    return out


@pytest.mark.parametrize("schedule, cls", [(ZERO_BUBBLE_V, torch_schedules.ScheduleZBVZeroBubble),
                                           (DUALPIPE_V, torch_schedules.ScheduleDualPipeV)])
@pytest.mark.parametrize("P", [2, 3, 4, 6])
def test_v_shaped_order_is_torchs(schedule, cls, P):
    """Two chunks per stage in a V (stage i runs chunks i and 2P − 1 − i), any c ≥ 2P."""
    for c in (2 * P, 2 * P + 1, 3 * P, 5 * P):
        order = {r: schedule.order(r, P, c, 2) for r in range(P)}
        assert torch_order(cls, P, c, 2) == order
        assert all(schedule.stage_of_chunk(j, P) == r for r, ops in order.items() for _, j, _ in ops)
        assert all(schedule.chunk_at(schedule.stage_of_chunk(j, P), j // P, P) == j for j in range(2 * P))


@pytest.mark.parametrize("schedule, cls, vs", [(INTERLEAVED_1F1B, torch_schedules.ScheduleInterleaved1F1B, (2, 3, 4)),
                                               (ZERO_BUBBLE, torch_schedules.ScheduleInterleavedZeroBubble, (1, 2, 3))])
@pytest.mark.parametrize("P", [2, 3, 4, 8])
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_order_is_torchs(schedule, cls, vs, P, rounds):
    for v in vs:
        c = P * rounds
        assert torch_order(cls, P, c, v) == {r: schedule.order(r, P, c, v) for r in range(P)}


def test_every_schedule_names_a_torch_class():
    for schedule in SCHEDULES.values():
        assert hasattr(pipelining, schedule.torch_class), schedule.torch_class
    assert exported_schedules("torchtitan")["zero-bubble"] == "InterleavedZeroBubble"
    assert "zero-bubble" not in exported_schedules("megatron")
    with pytest.raises(UniapError, match="unknown schedule"):
        schedule_named("zb-v")


@pytest.mark.parametrize("P, rounds, v", [(2, 1, 1), (4, 2, 1), (4, 2, 2), (8, 4, 2), (3, 2, 3)])
@pytest.mark.parametrize("f, i, w", [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (1.0, 1.2, 0.2)])
def test_zero_bubble_equal_chunks_take_the_analysis_time(P, rounds, v, f, i, w):
    """ZB1P's bubble is (P − 1)·(F + I − W) per chunk slot when the weight pass fills the rest (W ≤ I), against
    interleaved 1F1B's (P − 1)·(F + I + W): Qi et al. 2024's analysis, here from the simulated order."""
    c = P * rounds
    slot = f + i + w
    zb = uniform_makespan(ZERO_BUBBLE, P, c, v, f, i + w, w, 0.0)
    assert zb == pytest.approx(c * v * slot + (P - 1) * (f + i - w))
    if v > 1:
        assert uniform_makespan(INTERLEAVED_1F1B, P, c, v, f, i + w, w, 0.0) == pytest.approx((c * v + P - 1) * slot)


def test_zero_bubble_checks_its_pipeline():
    with pytest.raises(UniapError, match="multiple of the pipeline degree"):
        ZERO_BUBBLE.check(4, 6, 1)
    ZERO_BUBBLE.check(4, 8, 1)
    ZERO_BUBBLE.check(1, 3, 1)
    with pytest.raises(UniapError, match="virtual stages"):
        schedule_named("1f1b").check(4, 8, 2)


def test_zero_bubble_holds_activations_until_the_weight_pass():
    """Deferring W keeps a stage's activations longer than 1F1B does: stage i holds up to P − i + i micro-batches
    (its i deferred weight passes), the peak of held_patterns."""
    P, c = 4, 8
    for d in range(P):
        peak = max(sum(p) for p in ZERO_BUBBLE.held_patterns(P, c, 1)[d])
        assert peak >= P - d
    assert max(sum(p) for p in ZERO_BUBBLE.held_patterns(P, c, 1)[P - 1]) > 1


def test_torchtitan_names_resolve_to_the_runtime_class():
    """torchtitan builds `pipeline_parallel_schedule` with torch's get_schedule_class: the name exported must give
    the class `uniap run` trains with."""
    for ours, theirs in exported_schedules("torchtitan").items():
        assert torch_schedules.get_schedule_class(theirs).__name__ == schedule_named(ours).torch_class


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_closed_form_inflight_counts_are_what_the_order_holds(name):
    """GPipe and 1F1B give their in-flight counts in closed form; they equal what their operation order holds
    when each stage's first backward starts (the rule every schedule's `inflight` follows)."""
    schedule = SCHEDULES[name]
    for P in (1, 2, 3, 4, 8):
        for c in (1, 2, 3, 5, 8, 16, 40):
            assert schedule.inflight(P, c) == Schedule.inflight(schedule, P, c)


@pytest.mark.parametrize("schedule", list(SCHEDULES.values()), ids=lambda s: s.name)
def test_order_arrays_are_the_order(schedule):
    """Zero bubble computes its kinds and chunks without the tuples (the activation counts read them): the same."""
    for P in (2, 3, 4):
        shapes = [(2, c) for c in (2 * P, 3 * P + 1)] if isinstance(schedule, VShaped) else \
            [(v, c) for v in ((1,) if not schedule.interleaved else (2, 3)) for c in (P, 3 * P)]
        if schedule.name == "zero-bubble":
            shapes += [(1, P), (1, 2 * P)]
        for v, c in shapes:
            for stage in range(P):
                ops = schedule.order(stage, P, c, v)
                kinds, chunks = schedule.order_arrays(stage, P, c, v)
                assert kinds.tolist() == [k for k, _, _ in ops] and chunks.tolist() == [j for _, j, _ in ops]


@pytest.mark.parametrize("schedule", [ZERO_BUBBLE_V, DUALPIPE_V], ids=lambda s: s.name)
@pytest.mark.parametrize("P", [2, 3, 4, 5, 8, 13])
def test_v_shaped_occupancy_is_reached_by_2p_micro_batches(schedule, P):
    """`bounded_rounds`: the activation counts read off 2P micro-batches are what walking all c gives."""
    rounds = schedule.bounded_rounds(P, 6 * P)
    assert rounds == 2 * P
    for c in range(2 * P, 6 * P + 2):
        for stage in range(P):
            assert _stage_occupancy(schedule.name, stage, P, c, 2) == _stage_occupancy(schedule.name, stage, P,
                                                                                        rounds, 2)


@pytest.mark.parametrize("schedule", list(SCHEDULES.values()), ids=lambda s: s.name)
def test_chunk_at_is_where_stage_of_chunk_puts_a_chunk(schedule):
    """Each stage's position-k chunk is the one of k·P … k·P + P − 1 that the placement puts on that stage."""
    for P in (1, 2, 3, 5, 8):
        v = 2 if isinstance(schedule, VShaped) else 4
        for j in range(P * v):
            assert schedule.chunk_at(schedule.stage_of_chunk(j, P), j // P, P) == j


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_shared_simulation_is_the_event_simulation_when_nothing_is_shared(name):
    """`simulate_shared` runs every schedule's order as `simulate_order` does when no stage slows another, and a
    slowdown that does not depend on how many stages compute stretches the whole step by itself (sends aside)."""
    import random

    from uniap.schedules import chunks_per_stage, simulate_shared

    schedule = SCHEDULES[name]
    rng = random.Random(name)
    for P, c, v in ((2, 4, 2), (4, 8, 2), (3, 6, 3), (4, 4, 1), (4, 2, 1)):
        try:
            schedule.check(P, c, v)
        except UniapError:
            continue
        S = P * chunks_per_stage(schedule, v)
        fwd = [rng.uniform(0.5, 1.5) for _ in range(S)]
        bwd = [2 * x * rng.uniform(0.8, 1.2) for x in fwd]
        wgt = [0.4 * x for x in bwd]
        send = [rng.uniform(0.0, 0.2) for _ in range(S - 1)]
        alone = max(r.end for r in simulate_order(schedule, P, c, v, fwd, bwd, wgt, send))
        assert simulate_shared(schedule, P, c, v, fwd, bwd, wgt, send, lambda n: 1.0) == pytest.approx(alone)
        quiet = [0.0] * (S - 1)
        once = simulate_shared(schedule, P, c, v, fwd, bwd, wgt, quiet, lambda n: 1.0)
        assert simulate_shared(schedule, P, c, v, fwd, bwd, wgt, quiet, lambda n: 3.0) == pytest.approx(3 * once)
        # sharing only ever slows: the step is between alone and every stage always slowed by the most
        shared = simulate_shared(schedule, P, c, v, fwd, bwd, wgt, quiet, lambda n: max(1.0, n / 2))
        assert once - 1e-9 <= shared <= max(1.0, P / 2) * once + 1e-9
