"""The UOP: best candidate, bound skipping, serial and parallel agree, progress reported."""

import dataclasses

import numpy as np
import pytest
from random_tables import random_program

from uniap.solve.guesses import stagewise_guess
from uniap.solve.milp import solve
from uniap.solve.program import evaluate, lower_bound
from uniap.solve import uop
from uniap.solve.uop import search

CANDIDATES = [(p, c) for p in (1, 2, 3) for c in (1, 2, 4)]


def build(candidate):
    """(stages, micro-batches) over one table; c = 4 with 3 stages is declared impossible."""
    stages, micro = candidate
    if (stages, micro) == (3, 4):
        return None
    return random_program(21, layers=7, strategies=3, stages=stages, micro_batches=micro, runs=[1, 5, 1],
                          layouts=[0, 0, 1], memory=60.0)


def best_by_solving_all():
    results = {cand: solve(build(cand)) for cand in CANDIDATES if build(cand) is not None}
    feasible = {cand: sol.objective for cand, sol in results.items() if sol is not None}
    return min(feasible.items(), key=lambda item: item[1])


def test_search_finds_the_best_candidate():
    calls = []
    result = search(CANDIDATES, build, workers=1, progress=lambda *args: calls.append(args))
    best, objective = best_by_solving_all()
    assert result.best == best and result.solution.objective == pytest.approx(objective, rel=1e-6)
    assert result.optimal and result.gap == 0.0
    assert result.total == len(CANDIDATES) == len(result.records) == len(calls)
    assert [done for done, _, _ in calls] == list(range(1, len(CANDIDATES) + 1))
    assert calls[-1][2] == pytest.approx(objective)
    statuses = {r.candidate: r.status for r in result.records}
    assert statuses[(3, 4)] == "impossible"
    assert result.solved + result.skipped + 1 == result.total
    for record in result.records:
        if record.objective is not None:
            assert record.lower_bound <= record.objective * (1 + 1e-9)


def test_hopeless_candidate_is_skipped():
    def with_slow(candidate):
        if candidate == "slow":
            program = build((2, 4))
            return dataclasses.replace(program, A=program.A * 1000)
        return build(candidate)

    result = search([(2, 4), "slow"], with_slow, workers=1)
    slow = next(r for r in result.records if r.candidate == "slow")
    assert slow.status == "skipped" and result.skipped == 1 and result.solved == 1
    assert result.best == (2, 4) and result.optimal


def test_serial_and_parallel_agree():
    serial = search(CANDIDATES, build, workers=1)
    parallel = search(CANDIDATES, build, workers=2)
    assert parallel.best == serial.best
    assert parallel.solution.objective == pytest.approx(serial.solution.objective, rel=1e-9)
    assert parallel.optimal


def test_trials_cut_short_are_solved_again(monkeypatch):
    """A plain candidate's first MILP stops at TRIAL_S and goes back in the queue: with no time at all for trials,
    every candidate is solved a second time, and the search still proves the same optimum."""
    monkeypatch.setattr(uop, "TRIAL_S", 0.0)
    retried = []
    retry = uop._State.retry
    monkeypatch.setattr(uop._State, "retry", lambda self, *a: retried.append(retry(self, *a)) or retried[-1])
    result = search(CANDIDATES, build, workers=1)
    assert any(retried)
    best, objective = best_by_solving_all()
    assert result.best == best and result.solution.objective == pytest.approx(objective, rel=1e-6)
    assert result.optimal and result.gap == 0.0


def _unfolded(candidate):
    """`build`'s tables with every layer a kind of its own (no two neighbours fold into one run)."""
    stages, micro = candidate
    return None if (stages, micro) == (3, 4) else \
        random_program(21, layers=7, strategies=3, stages=stages, micro_batches=micro, memory=60.0)


def _queue(build_):
    return sorted((0, lower_bound(build_(cand)), i) for i, cand in enumerate(CANDIDATES) if build_(cand) is not None)


def test_an_unfolded_chain_starts_from_the_best_stagewise_plan():
    queue = _queue(_unfolded)
    promising = [stagewise_guess(_unfolded(CANDIDATES[i])) for _, _, i in queue[:uop.STAGEWISE_GUESSES]]
    best = min(found.objective for found in promising if found is not None)
    index, incumbent = uop._stagewise_incumbent(queue, set(), CANDIDATES, _unfolded, None)
    assert incumbent.solver == "stagewise" and incumbent.objective == best
    assert incumbent.objective == evaluate(_unfolded(CANDIDATES[index]), incumbent.stage_of, incumbent.strategy_of)
    worse = (0, dataclasses.replace(incumbent, objective=best * 2))
    assert uop._stagewise_incumbent(queue, set(), CANDIDATES, _unfolded, worse)[1].objective == best
    better = (0, dataclasses.replace(incumbent, objective=best / 2))
    assert uop._stagewise_incumbent(queue, set(), CANDIDATES, _unfolded, better) is better


def test_a_folded_chain_keeps_its_uniform_incumbent():
    queue = _queue(build)
    kept = (0, uop.uniform_guess(build(CANDIDATES[0])))
    assert uop._stagewise_incumbent(queue, set(), CANDIDATES, build, kept) is kept


def test_bounds_built_in_workers_agree(monkeypatch):
    """Candidates whose building would take long are built and bounded in worker processes, a share each: the same
    records as here."""
    monkeypatch.setattr(uop, "PARALLEL_BOUNDS_S", 0.0)
    monkeypatch.setattr(uop, "SERIAL_BUDGET_S", 0.0)
    spawned = []
    executor = uop.ProcessPoolExecutor
    monkeypatch.setattr(uop, "ProcessPoolExecutor", lambda *a, **k: spawned.append(1) or executor(*a, **k))
    serial = search(CANDIDATES, build, workers=1)
    parallel = search(CANDIDATES, build, workers=2)
    assert parallel.best == serial.best and parallel.optimal
    assert parallel.solution.objective == pytest.approx(serial.solution.objective, rel=1e-9)
    assert [(r.candidate, r.lower_bound) for r in parallel.records] == \
        [(r.candidate, r.lower_bound) for r in serial.records]
    assert [r.status for r in parallel.records if r.status == "impossible"] == ["impossible"]
    assert spawned  # the bounds (at least) were built in workers


def test_two_candidates_waiting_for_milp_steps_go_to_the_workers():
    """Two candidates that can still win and wait for a MILP step start the workers: those steps take 0.05 s or
    13 s with nothing to tell which beforehand. One waiting, or two that the incumbent already beats, do not."""
    state = uop._State(CANDIDATES, {}, None)
    state.best = dataclasses.replace(uop.uniform_guess(build(CANDIDATES[0])), objective=10.0)
    queue = [(0, 1.0, 0), (0, 2.0, 1), (0, 3.0, 2), (0, 11.0, 3)]
    assert not uop._milps_waiting(queue, state)
    state.deferred[1] = 0.02
    state.deferred[3] = 0.02  # beaten by the incumbent: it will be skipped
    assert not uop._milps_waiting(queue, state)
    state.deferred[2] = 0.02
    assert uop._milps_waiting(queue, state)


def test_nothing_feasible():
    def hopeless(candidate):
        return dataclasses.replace(build(candidate), memory_capacity=1e-3)

    result = search([(1, 1), (2, 2)], hopeless, workers=1)
    assert result.best is None and result.solution is None and result.optimal
    assert {r.status for r in result.records} == {"infeasible"}


def test_time_limit_zero_keeps_the_uniform_guess():
    # No MILP runs; what comes back is the best hand-style plan (even split, one strategy), with its gap to the
    # least bound of the candidates that were not settled.
    result = search(CANDIDATES[:3], build, workers=1, time_limit=0.0)
    assert all(r.status in ("timeout", "impossible", "skipped") for r in result.records)
    assert result.solved == 0
    if any(r.status == "timeout" for r in result.records):
        assert not result.optimal
    if result.solution is not None:
        program = build(result.best)
        assert result.solution.objective == evaluate(program, result.solution.stage_of, result.solution.strategy_of)
        assert result.gap >= 0


def test_records_keep_candidate_order():
    result = search(list(reversed(CANDIDATES)), build, workers=1)
    assert [r.candidate for r in result.records] == list(reversed(CANDIDATES))
    assert np.isfinite([r.lower_bound for r in result.records if r.status != "impossible"]).all()


@pytest.mark.parametrize("seed", range(12))
def test_interleaved_candidates_solved_in_phases_reach_the_whole_solve(seed):
    """An interleaved candidate deferred after its group bound and after its device-group MILPs, then solved by
    its chunk MILP, ends where one whole solve does; each deferral carries a bound at most that optimum."""
    from uniap.solve.milp import solve_outcome

    program = random_program(40 + seed, layers=9, strategies=3, stages=2, micro_batches=4, runs=[1, 7, 1],
                             layouts=[0, 0, 1], memory=60.0, virtual_stages=2)
    whole = solve(program)
    cutoff = 1e9  # an incumbent that everything beats, so no phase is cut off
    for phase in ("bound", "relaxation", "chunks"):
        outcome = solve_outcome(program, cutoff=cutoff, phase=phase)
        if outcome.status != "deferred":
            break
        assert whole is not None and outcome.bound <= whole.objective * (1 + 1e-9)
    if whole is None:
        assert outcome.solution is None
    else:
        assert outcome.status == "optimal" and outcome.solution.objective == pytest.approx(whole.objective)


def test_a_chain_of_several_block_kinds_is_deferred_by_its_one_block_bound_then_its_device_group_milps():
    """Runs of 2, 5 and 2 layers: the group bound does not cover the chain, its one-block relaxation does
    (solve.one_block), and the device-group MILPs come after."""
    from uniap.solve.milp import solve_outcome

    program = random_program(3, layers=9, strategies=3, stages=2, micro_batches=4, runs=[2, 5, 2],
                             layouts=[0, 0, 1], memory=60.0, virtual_stages=2)
    optimum = solve(program).objective
    first = solve_outcome(program, cutoff=1e9, phase="bound")
    assert first.status == "deferred" and first.phase == "bound" and first.bound <= optimum * (1 + 1e-9)
    second = solve_outcome(program, cutoff=1e9, phase="relaxation", known=first.bound)
    assert second.status == "deferred" and second.phase == "relaxation" and second.bound <= optimum * (1 + 1e-9)
    final = solve_outcome(program, cutoff=1e9, phase="chunks")
    assert final.solution.objective == pytest.approx(optimum)
