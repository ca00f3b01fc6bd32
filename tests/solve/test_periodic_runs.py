"""Runs that repeat a pattern of layers (GPT-OSS alternates sliding-window and full attention): found from the
arrays, folded into one run of several phases, and the MILP over them keeps the optimum of the enumeration oracle
and of the unfolded MILP, pricing every plan as `evaluate` does."""

import dataclasses
import math

import numpy as np
import pytest
from random_tables import assert_same_optimum, check_encode, random_program

from uniap.schedules import INTERLEAVED, ZERO_BUBBLE
from uniap.solve.bounds import partition_bound
from uniap.solve.formulation import Formulation
from uniap.solve.milp import _chunk_runs, solve
from uniap.solve.reduce import reduce_program
from uniap.solve.reference import solve_reference

SCHEDULES = ("gpipe", "1f1b", ZERO_BUBBLE.name)


def _case(seed: int, schedule: str, layers: int | None = None, stages: int | None = None):
    """An embedding, a run repeating 2 or 3 different layers, and a head; small enough for the oracle unless
    `layers` says otherwise. Memory binds in some cases."""
    rng = np.random.default_rng(50_000 + seed)
    period = 3 if seed % 3 == 0 else 2
    inner = layers - 2 if layers is not None else int(rng.integers(2 * period, 7))
    P = stages if stages is not None else int(rng.integers(1, 4))
    K = int(rng.integers(2, 4))
    c = 2 * P if schedule == ZERO_BUBBLE.name else int(rng.integers(1, 6))
    return random_program(seed, layers=inner + 2, strategies=K, stages=P, micro_batches=c, runs=[1, inner, 1],
                          periods=[1, period, 1], schedule=schedule,
                          memory=float(rng.uniform(15, 60)) if rng.random() < 0.7 else None,
                          layouts=sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None)


def test_a_repeating_pattern_is_found_and_identical_layers_stay_period_one():
    alternating = random_program(0, layers=11, runs=[1, 9, 1], periods=[1, 3, 1])
    runs = reduce_program(alternating, fold=True, periodic=True).runs
    assert [(run.first, run.length, run.period) for run in runs] == [(0, 1, 1), (1, 9, 3), (10, 1, 1)]
    assert list(runs[1].phase_counts()) == [3, 3, 3]
    # without `periodic` nothing folds: no two neighbours are equal
    assert len(reduce_program(alternating, fold=True).runs) == 11
    identical = random_program(0, layers=8, runs=[1, 6, 1])
    periodic = reduce_program(identical, fold=True, periodic=True).runs
    assert [(run.first, run.length, run.period) for run in periodic] == [(0, 1, 1), (1, 6, 1), (7, 1, 1)]
    # a pattern seen fewer than twice is no run: three layers of period 2 are three runs of one
    short = random_program(0, layers=5, runs=[1, 3, 1], periods=[1, 2, 1])
    assert all(run.length == 1 for run in reduce_program(short, fold=True, periodic=True).runs)


def test_a_change_inside_the_pattern_ends_the_run():
    program = random_program(3, layers=10, runs=[1, 8, 1], periods=[1, 2, 1])
    program.A[6] = program.A[6] + 1.0  # layer 6 no longer equals layer 4
    runs = reduce_program(program, fold=True, periodic=True).runs
    assert (1, 5, 2) in [(run.first, run.length, run.period) for run in runs]
    program = random_program(3, layers=10, runs=[1, 8, 1], periods=[1, 2, 1])
    program.R[5] = program.R[5] + 1.0  # the edge (5, 6) no longer equals (3, 4)
    runs = reduce_program(program, fold=True, periodic=True).runs
    assert (1, 5, 2) in [(run.first, run.length, run.period) for run in runs]


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("seed", range(10))
def test_periodic_runs_keep_the_reference_optimum(schedule, seed):
    program = _case(seed, schedule)
    assert any(run.period > 1 for run in reduce_program(program, fold=True, periodic=True).runs)
    assert_same_optimum(program, solve(program), solve_reference(program))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("seed", range(4))
def test_periodic_runs_keep_the_unfolded_optimum_on_longer_chains(schedule, seed):
    """Chains too long for the oracle: the folded MILP's optimum is the one-binary-per-layer MILP's."""
    program = _case(seed, schedule, layers=16 + seed, stages=3)
    folded, plain = solve(program), solve(program, fold=False)
    assert (folded is None) == (plain is None)
    if plain is not None:
        assert folded.optimal and plain.optimal
        assert abs(folded.objective - plain.objective) <= 1e-6 * plain.objective


def _chunked_case(seed: int, schedule: str):
    """An embedding, a run repeating 2 or 3 different layers and a head, on 2–3 device groups of 2–3 chunks."""
    rng = np.random.default_rng(60_000 + seed)
    period = 3 if seed % 3 == 0 else 2
    P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
    inner = int(rng.integers(max(2 * period, P * v - 2), P * v + 3))
    K = int(rng.integers(2, 4))
    return random_program(seed, layers=inner + 2, strategies=K, stages=P, micro_batches=P * int(rng.integers(1, 3)),
                          runs=[1, inner, 1], periods=[1, period, 1], virtual_stages=v, schedule=schedule,
                          memory=float(rng.uniform(15, 60)) if rng.random() < 0.7 else None,
                          layouts=sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None)


@pytest.mark.parametrize("schedule", (INTERLEAVED, ZERO_BUBBLE.name))
@pytest.mark.parametrize("seed", range(12))
def test_the_chunk_milp_of_an_interleaved_periodic_chain_keeps_the_reference_optimum(schedule, seed):
    """v > 1: the chunk MILP takes the periodic runs (milp._chunk_runs), the device-group steps the plain ones;
    the optimum is the oracle's, with and without a cut-off just above it."""
    program = _chunked_case(seed, schedule)
    assert _chunk_runs(program, reduce_program(program, fold=True)) is not None
    reference = solve_reference(program)
    assert_same_optimum(program, solve(program), reference)
    if reference is not None:
        assert_same_optimum(program, solve(program, cutoff=reference.objective * 1.01), reference)


def test_a_pattern_holding_identical_layers_keeps_plain_runs_in_the_chunk_milp():
    """A group runs a stretch of identical layers under one strategy, which phases do not say: a pattern A A B
    leaves the chunk MILP the plain runs."""
    program = random_program(5, layers=11, runs=[1, 9, 1], periods=[1, 3, 1], stages=2, virtual_stages=2)
    assert _chunk_runs(program, reduce_program(program, fold=True)) is not None
    for u in range(1, 10, 3):  # layer u + 1 made equal to layer u: the pattern is (A, A, B)
        for table in (program.A, program.G, program.Ms, program.Ma, program.allowed):
            table[u + 1] = table[u]
        program.group[u + 1] = program.group[u]
        program.R[u] = program.R[u + 2]  # the edge A → A priced as B → A: the plain runs see A A as one run
        program.Rp[u] = program.Rp[u + 2]
    runs = reduce_program(program, fold=True, periodic=True).runs
    assert any(run.period == 3 for run in runs)
    assert _chunk_runs(program, reduce_program(program, fold=True)) is None


@pytest.mark.parametrize("schedule", ("gpipe", "1f1b"))
@pytest.mark.parametrize("seed", range(10))
def test_the_partition_bound_of_a_periodic_chain_never_exceeds_the_optimum_or_the_cutoff(schedule, seed):
    program = _case(seed, schedule)
    ref = solve_reference(program)
    optimum = math.inf if ref is None else ref.objective
    assert partition_bound(program) <= optimum * (1 + 1e-9)
    for factor in (0.9, 1.0, 1.05) if ref is not None else ():
        assert partition_bound(program, optimum * factor) <= min(optimum, optimum * factor) * (1 + 1e-9)


def test_the_partition_bound_is_exact_on_a_periodic_chain_without_side_costs():
    """One strategy, no resharding, sends or once-per-iteration time: the TPI is a function of the partition
    only, and a stage's layers of each phase follow from where it starts, which the bound's tables count."""
    program = random_program(13, layers=10, strategies=1, stages=3, micro_batches=8, runs=[1, 8, 1],
                             periods=[1, 2, 1], memory=60.0)
    program = dataclasses.replace(program, R=np.zeros_like(program.R), Rp=np.zeros_like(program.Rp),
                                  G=np.zeros_like(program.G))
    assert reduce_program(program, fold=True, periodic=True).runs[1].period == 2
    assert partition_bound(program) == pytest.approx(solve_reference(program).objective, rel=1e-12)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("seed", range(4))
def test_periodic_formulation_prices_plans_like_evaluate(schedule, seed):
    check_encode(_case(seed, schedule, layers=12, stages=3), seed, periodic=True)


def test_subtours_of_a_periodic_run_are_cut(monkeypatch):
    """test_solve_milp's sub-tour case with its seven blocks made two phases (the second's classes 1 and 2 a
    little slower): the segment starts and ends in phase 0, so a flow can leave the first block in class 0 alone
    and close the other six into a loop 1 → 2 → 1 of their own. It must be cut, and the plan decoded from the
    final point keeps every layer in its phase (assert_same_optimum prices it)."""
    program = random_program(1, layers=8, strategies=3, stages=1, runs=[1, 7], periods=[1, 2], memory=None)
    program.allowed[:] = True
    program.A[1::2] = [5.0, 1.0, 1.0]
    program.A[2::2] = [5.0, 1.2, 1.2]
    program.R[0] = [[0.0, 100.0, 100.0]] * 3
    program.R[1:] = [[10.0, 3.0, 3.0], [3.0, 10.0, 0.1], [3.0, 0.1, 10.0]]
    runs = reduce_program(program, fold=True, periodic=True).runs
    assert [(run.length, run.period) for run in runs] == [(1, 1), (7, 2)]
    seen = []
    cuts = Formulation.cuts
    monkeypatch.setattr(Formulation, "cuts", lambda self, subtours: (seen.extend(subtours), cuts(self, subtours))[1])
    assert_same_optimum(program, solve(program), solve_reference(program))
    assert any(r == 1 and len(classes) > 1 for r, classes in seen)
