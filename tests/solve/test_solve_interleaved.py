"""Interleaved 1F1B programs (v chunks per device group): the MILP against the enumeration oracle, and the formula."""

import numpy as np
import pytest
from random_tables import check_encode, check_matches_reference, random_program

from uniap.errors import UniapError
from uniap.solve.bounds import _least, front
from uniap.solve.milp import solve
from uniap.solve.program import evaluate, lower_bound, stage_times
from uniap.schedules import INTERLEAVED_1F1B, schedule_named
from uniap.solve.reference import solve_reference


interleaved_order = INTERLEAVED_1F1B.order


def inflight(schedule, P, c, v=1):
    """The schedule's in-flight counts per chunk (`Schedule.inflight`)."""
    return schedule_named(schedule).inflight(P, c, v)


def _case(seed: int):
    rng = np.random.default_rng(20_000 + seed)
    L = int(rng.integers(4, 8))
    K = int(rng.integers(1, 4))
    v = 2
    P = 2
    cuts = sorted(rng.choice(np.arange(1, L), size=int(rng.integers(0, 3)), replace=False).tolist())
    runs = np.diff([0, *cuts, L]).tolist()
    memory = float(rng.uniform(20, 60)) if rng.random() < 0.7 else None
    return random_program(seed, layers=L, strategies=K, stages=P, micro_batches=2 * int(rng.integers(1, 3)),
                          runs=runs, memory=memory, virtual_stages=v,
                          layouts=sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None)


@pytest.mark.parametrize("seed", range(24))
def test_interleaved_milp_matches_reference(seed):
    check_matches_reference(_case(seed))


@pytest.mark.parametrize("seed", range(6))
def test_least_matches_the_whole_minkowski_sum(seed):
    rng = np.random.default_rng(seed)
    cap = 10.0
    fronts = [front(rng.uniform(0, 5, 4), rng.uniform(0, 4, 4), int(rng.integers(1, 4)), cap)[-1] for _ in range(3)]
    sums = [(0.0, 0.0)]
    for cost, weight in fronts:
        sums = [(c + fc, w + fw) for c, w in sums for fc, fw in zip(cost, weight)]
    expected = min((c for c, w in sums if w <= cap), default=np.inf)
    assert _least(fronts, cap) == pytest.approx(expected)


@pytest.mark.parametrize("seed", range(8))
def test_interleaved_encode_gives_the_evaluated_objective(seed):
    program = _case(seed)
    check_encode(program, seed)


@pytest.mark.parametrize("seed", range(36))
def test_the_slot_bound_never_exceeds_a_plan_or_the_optimum(seed):
    """lower_bound's slot bound (whole layers per chunk: solve.program._slots_bound) on chains with a long run of
    identical layers, where it binds: at most the TPI of every plan tried (any split, any strategies) and the
    enumeration optimum."""
    rng = np.random.default_rng(50_000 + seed)
    P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
    L = P * v + int(rng.integers(1, 4))
    program = random_program(seed, layers=L, strategies=int(rng.integers(1, 4)), stages=P,
                             micro_batches=P * int(rng.integers(1, 4)), runs=[1, L - 2, 1] if seed % 2 else [L],
                             memory=float(rng.uniform(30, 90)) if seed % 4 < 2 else None, virtual_stages=v)
    bound = lower_bound(program)
    reference = solve_reference(program)
    if reference is not None:
        assert bound <= reference.objective * (1 + 1e-9)
    for _ in range(40):
        cuts = np.sort(rng.choice(np.arange(1, L), size=program.stages - 1, replace=False))
        stage_of = np.searchsorted(cuts, np.arange(L), side="right")
        strategy_of = np.array([rng.choice(np.flatnonzero(program.allowed[u])) for u in range(L)])
        assert bound <= evaluate(program, stage_of, strategy_of) * (1 + 1e-9)


def test_the_slot_bound_sees_whole_layers():
    """Five 1 s layers in 2 × 2 chunks, c = 2, nothing else: one chunk holds two layers, which the mean-based
    bound S/v + (c − 1/v)·S/P = 6.25 s does not see; the slot bound does, and stays at most the optimum."""
    program = random_program(0, layers=5, strategies=1, stages=2, micro_batches=2, runs=[5], memory=None,
                             virtual_stages=2)
    for table, value in ((program.A, 1.0), (program.G, 0.0), (program.R, 0.0), (program.Rp, 0.0)):
        table[...] = value
    optimum = solve_reference(program).objective
    assert 6.25 * (1 + 1e-6) < lower_bound(program) <= optimum * (1 + 1e-9)


def test_interleaved_formula_on_a_balanced_pipeline():
    # P = 2 groups × v = 2 chunks, c = 4, every chunk 1 s, no sends: TPI = (c + (P − 1)/v)·p with p = 2 s per group
    program = random_program(0, layers=4, strategies=1, stages=2, micro_batches=4, virtual_stages=2, memory=None)
    program = type(program)(**{**program.__dict__, "A": np.ones((4, 1)), "G": np.zeros((4, 1)),
                               "R": np.zeros((3, 1, 1)), "Rp": np.zeros((3, 1, 1)),
                               "allowed": np.ones((4, 1), dtype=bool)})
    stage_of, strategy_of = np.arange(4), np.zeros(4, dtype=int)
    assert evaluate(program, stage_of, strategy_of) == pytest.approx((4 + 1 / 2) * 2)
    times = stage_times(program, stage_of, strategy_of)
    assert list(times.p) == [2.0, 2.0] and list(times.chunk_p) == [1.0] * 4
    # the same chain as plain 1F1B over 2 stages: (c + P − 1)·p = 5·2
    plain = type(program)(**{**program.__dict__, "stages": 2, "virtual_stages": 1, "held": None,
                             "inflight": np.array(inflight("1f1b", 2, 4), dtype=float)})
    assert evaluate(plain, np.array([0, 0, 1, 1]), strategy_of) == pytest.approx(10.0)


def test_interleaved_inflight_follows_the_torch_warmup():
    # P = 4, v = 2, c = 8: when group d's first backward starts it holds min(c·v, (v−1)·P + 2·(P−1−d) + 1) chunk
    # activations, its first chunk filled first (round by round: P micro-batches of chunk 0, then of chunk 1)
    held = inflight("interleaved-1f1b", 4, 8, 2)
    assert held[:4] == [7, 5, 4, 4] and held[4:] == [4, 4, 3, 1]
    for d in range(4):
        ops = interleaved_order(d, 4, 8, 2)
        first_backward = next(k for k, op in enumerate(ops) if op[0] == "B")
        assert first_backward == held[d] + held[d + 4]
    assert sum(inflight("interleaved-1f1b", 2, 2, 4)[0::2]) == 2 * 4  # capped at c·v


def test_held_patterns_bound_every_moment_of_the_schedule():
    """Every occupancy the schedule passes through is covered by one of the stage's patterns, and the patterns are
    moments of it, none covered by another: the largest Σ held·Ma over them is the peak for any chunk sizes."""
    for P, c, v in ((2, 4, 2), (4, 8, 2), (4, 16, 3), (3, 6, 4), (2, 24, 3), (4, 40, 2)):
        patterns = INTERLEAVED_1F1B.held_patterns(P, c, v)
        for d in range(P):
            held, seen = [0] * v, set()
            for kind, chunk, _ in interleaved_order(d, P, c, v):
                held[chunk // P] += 1 if kind == "F" else -1
                seen.add(tuple(held))
                assert any(all(p >= h for p, h in zip(pattern, held)) for pattern in patterns[d])
            assert all(tuple(pattern) in seen for pattern in patterns[d])
            for i, a in enumerate(patterns[d]):  # and none is covered by another: the peaks are all that is kept
                assert not any(j != i and all(x >= y for x, y in zip(b, a)) for j, b in enumerate(patterns[d]))


def test_scip_refuses_interleaved_programs():
    with pytest.raises(UniapError, match="plain pipelines only"):
        solve(_case(0), solver="scip")
