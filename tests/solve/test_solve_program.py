"""The objective (`evaluate`), table validation, reductions and lower bounds."""

import dataclasses
import math

import numpy as np
import pytest
from random_tables import random_case, random_program

from uniap.errors import UniapError
from uniap.solve.bounds import partition_bound
from uniap.program import StageProgram
from uniap.solve.program import evaluate, lower_bound, stage_times
from uniap.solve.reduce import reduce_program
from uniap.solve.reference import solve_reference


def tiny() -> StageProgram:
    return StageProgram(
        A=np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]]),
        G=np.array([[0.5, 0.1], [0.2, 0.3], [0.4, 0.4]]),
        Ms=np.array([[1.0, 1.0], [2.0, 1.0], [1.0, 1.0]]),
        Ma=np.array([[1.0, 0.5], [1.0, 1.0], [2.0, 1.0]]),
        R=np.array([[[0.0, 0.5], [0.5, 0.0]], [[0.0, 0.3], [0.2, 0.0]]]),
        Rp=np.array([[[0.1, 0.2], [0.3, 0.4]], [[0.6, 0.7], [0.8, 0.9]]]),
        allowed=np.ones((3, 2), dtype=bool),
        stages=2, micro_batches=3, inflight=np.array([2.0, 1.0]), memory_capacity=10.0, group=np.array([0, 1, 2]))


def test_evaluate_by_hand():
    # Layers 0,1 on stage 0 under strategies 0,1; layer 2 on stage 1 under strategy 1.
    # p0 = A[0,0] + A[1,1] + R[0][0,1] = 1 + 1 + 0.5 = 2.5      p1 = A[2,1] = 2
    # o0 = Rp[1][1,1] = 0.9 (edge 1→2 crosses the boundary)
    # g0 = G[0,0] + G[1,1] = 0.8                                g1 = G[2,1] = 0.4
    # bottleneck = max(p0 + o0/2, p1 + o0/2, o0) = max(2.95, 2.45, 0.9) = 2.95
    # TPI = (2.5 + 2) + 0.9 + (3 − 1)·2.95 + max(0.8, 0.4) = 12.1
    # memory: stage 0 = 1 + 1 + 2·(1 + 1) = 6, stage 1 = 1 + 1·1 = 2
    program, stage_of, strategy_of = tiny(), [0, 0, 1], [0, 1, 1]
    assert evaluate(program, stage_of, strategy_of) == pytest.approx(12.1)
    times = stage_times(program, stage_of, strategy_of)
    np.testing.assert_allclose(times.p, [2.5, 2.0])
    np.testing.assert_allclose(times.o, [0.9])
    np.testing.assert_allclose(times.g, [0.8, 0.4])
    np.testing.assert_allclose(times.memory, [6.0, 2.0])
    assert evaluate(dataclasses.replace(program, memory_capacity=5.9), stage_of, strategy_of) == math.inf


def test_evaluate_infeasible_plans():
    program = tiny()
    program = dataclasses.replace(program, allowed=np.array([[True, True], [True, True], [True, False]]))
    assert evaluate(program, [0, 0, 1], [0, 1, 1]) == math.inf  # strategy 1 not allowed on layer 2
    assert evaluate(program, [0, 1, 0], [0, 0, 0]) == math.inf  # not contiguous
    assert evaluate(program, [0, 0, 0], [0, 0, 0]) == math.inf  # stage 1 empty
    assert evaluate(program, [1, 1, 1], [0, 0, 0]) == math.inf  # stage 0 empty
    assert math.isfinite(evaluate(program, [0, 1, 1], [0, 0, 0]))


def test_evaluate_rejects_malformed_plans():
    program = tiny()
    with pytest.raises(UniapError):
        evaluate(program, [0, 0], [0, 0])
    with pytest.raises(UniapError):
        evaluate(program, [0, 0, 1], [0, 2, 0])
    with pytest.raises(UniapError):
        evaluate(program, [0, 0, 2], [0, 0, 0])


@pytest.mark.parametrize("change, message", [
    (dict(stages=4), "cannot be filled"),
    (dict(G=np.zeros((2, 2))), "shape"),
    (dict(inflight=np.ones(3)), "shape"),
    (dict(A=np.array([[1.0, -1.0], [1.0, 1.0], [1.0, 1.0]])), "negative"),
    (dict(memory_capacity=0.0), "memory_capacity"),
    (dict(allowed=np.ones((3, 2))), "boolean"),
])
def test_validate(change, message):
    with pytest.raises(UniapError, match=message):
        dataclasses.replace(tiny(), **change).validate()
    tiny().validate()


def test_disallowed_entries_may_hold_anything():
    program = tiny()
    program.allowed[2, 1] = False
    program.A[2, 1], program.Ms[2, 1], program.R[1, :, 1] = math.inf, math.nan, math.nan
    program.validate()
    assert evaluate(program, [0, 0, 1], [0, 1, 0]) < math.inf


def test_reduce_folds_runs_and_merges_layouts():
    program = random_program(5, layers=8, strategies=4, stages=2, runs=[1, 5, 2], layouts=[0, 0, 1, 1])
    folded = reduce_program(program, fold=True)
    assert [(run.first, run.length) for run in folded.runs] == [(0, 1), (1, 5), (6, 2)]
    for run in folded.runs:
        assert run.classes <= 2 and len(run.keep) <= int(program.allowed[run.first].sum())
    plain = reduce_program(program, fold=False)
    assert [run.length for run in plain.runs] == [1] * 8
    assert all(run.classes == int(program.allowed[run.first].sum()) for run in plain.runs)


def test_reduce_drops_dominated_strategies_of_one_layout():
    program = random_program(6, layers=3, strategies=3, stages=1, layouts=[0, 0, 0], runs=[3])
    program.allowed[:] = True
    program.A[:] = program.A[0]
    program.A[:, 1] = program.A[0, 0] + 1  # strategy 1: slower than 0 and no better in anything else
    for table in (program.G, program.Ms, program.Ma):
        table[:, 1] = table[0, 0] + 1
    run = reduce_program(program, fold=True).runs[0]
    assert 1 not in run.keep and 0 in run.keep


@pytest.mark.parametrize("seed", range(12))
def test_bounds_never_exceed_the_optimum(seed):
    program = random_case(seed, max_layers=6)
    ref = solve_reference(program)
    optimum = math.inf if ref is None else ref.objective
    assert lower_bound(program) <= optimum * (1 + 1e-9)
    assert partition_bound(program) <= optimum * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_partition_bound_with_a_cutoff_never_exceeds_the_optimum_or_the_cutoff(seed):
    # With a cutoff the bound skips stage contents too slow to beat it: it must stay ≤ min(optimum, cutoff),
    # and prove at least as much as the bound without one (it minimises over fewer partitions).
    program = random_case(seed, max_layers=6)
    ref = solve_reference(program)
    if ref is None:
        pytest.skip("an infeasible case: every bound is valid")
    for factor in (0.9, 1.0, 1.05, 1.5):
        cutoff = ref.objective * factor
        bound = partition_bound(program, cutoff)
        assert bound <= min(ref.objective, cutoff) * (1 + 1e-9)
        assert bound >= min(partition_bound(program), cutoff) * (1 - 1e-9)


def test_partition_bound_is_exact_without_side_costs():
    # One strategy, no resharding, sends or once-per-iteration time: the TPI is a function of the partition only,
    # which the DP enumerates exactly (the layers are identical except the first and the last).
    program = random_program(13, layers=9, strategies=1, stages=3, micro_batches=8, runs=[1, 7, 1], memory=60.0)
    program = dataclasses.replace(program, R=np.zeros_like(program.R), Rp=np.zeros_like(program.Rp),
                                  G=np.zeros_like(program.G))
    assert partition_bound(program) == pytest.approx(solve_reference(program).objective, rel=1e-12)
