"""The MILP against the enumeration oracle: same optimum, objective = evaluate, every back-end, folded or not."""

import importlib.util
import math

import numpy as np
import pytest
from random_tables import assert_same_optimum, random_case, random_program

from uniap.errors import UniapError
from uniap.solve.formulation import Formulation
from uniap.solve.milp import solve, solve_outcome
from uniap.solve.program import evaluate
from uniap.solve.reduce import reduce_program
from uniap.solve.reference import solve_reference

HAS_SCIP = importlib.util.find_spec("pyscipopt") is not None
HAS_GUROBI = importlib.util.find_spec("gurobipy") is not None


@pytest.mark.parametrize("seed", range(40))
def test_highs_matches_reference(seed):
    program = random_case(seed)
    reference = solve_reference(program)
    for fold in (True, False):
        assert_same_optimum(program, solve(program, fold=fold), reference)


@pytest.mark.skipif(not HAS_SCIP, reason="pyscipopt not installed")
@pytest.mark.parametrize("seed", range(6))
def test_scip_matches_reference(seed):
    program = random_case(seed, max_layers=5)
    assert_same_optimum(program, solve(program, solver="scip"), solve_reference(program))


@pytest.mark.skipif(not HAS_GUROBI, reason="gurobipy not installed")
@pytest.mark.parametrize("seed", range(6))
def test_gurobi_matches_reference(seed):
    program = random_case(seed, max_layers=5)
    reference = solve_reference(program)
    for fold in (True, False):
        assert_same_optimum(program, solve(program, solver="gurobi", fold=fold), reference)


@pytest.mark.parametrize("seed", range(6))
def test_folding_identical_layers_keeps_the_optimum(seed):
    # One long run of identical layers with arbitrary (non-metric, self-loop-costing) resharding inside it: the
    # flow over layout classes is where sub-tours appear, and the cut loop must remove them.
    program = random_program(seed, layers=8, strategies=3, stages=2 + seed % 2, runs=[1, 6, 1],
                             layouts=[0, 1, 1] if seed % 2 else None, memory=45.0)
    reference = solve_reference(program)
    folded, plain = solve(program, fold=True), solve(program, fold=False)
    assert_same_optimum(program, folded, reference)
    assert_same_optimum(program, plain, reference)


def test_subtours_are_cut(monkeypatch):
    # Layer 1 must start in class 0 (entering 1 or 2 from layer 0 is prohibitive); classes 1 and 2 are fast and
    # cheap to alternate, staying in a class is dear. The real optimum pays once to leave class 0; a flow over
    # class counts can instead close 1 → 2 → 1 into a loop of its own that never touches class 0 (it passes the
    # single-class cuts), so the loop must add the cut for {1, 2} and solve again.
    program = random_program(1, layers=6, strategies=3, stages=1, runs=[1, 5], memory=None)
    program.allowed[:] = True
    program.A[1:] = [5.0, 1.0, 1.0]
    program.R[0] = [[0.0, 100.0, 100.0]] * 3
    program.R[1:] = [[10.0, 3.0, 3.0], [3.0, 10.0, 0.1], [3.0, 0.1, 10.0]]
    seen = []
    cuts = Formulation.cuts
    monkeypatch.setattr(Formulation, "cuts", lambda self, subtours: (seen.extend(subtours), cuts(self, subtours))[1])
    reference = solve_reference(program)
    assert_same_optimum(program, solve(program), reference)
    assert (1, frozenset({1, 2})) in seen
    assert list(reference.strategy_of[1:3]) == [0, 1] or list(reference.strategy_of[1:3]) == [0, 2]


def test_memory_tight_and_infeasible():
    program = random_program(2, layers=6, strategies=3, stages=2, memory=None)
    loose = solve_reference(program)
    times = [evaluate(program, loose.stage_of, loose.strategy_of)]
    program_tight = random_program(2, layers=6, strategies=3, stages=2, memory=18.0)
    tight = solve_reference(program_tight)
    assert tight is not None and tight.objective >= times[0]
    assert_same_optimum(program_tight, solve(program_tight), tight)
    hopeless = random_program(2, layers=6, strategies=3, stages=2, memory=1.0)
    assert solve_reference(hopeless) is None
    assert solve(hopeless) is None and solve(hopeless, fold=False) is None
    if HAS_SCIP:
        assert solve(hopeless, solver="scip") is None


@pytest.mark.parametrize("seed", range(8))
def test_formulation_prices_plans_like_evaluate(seed):
    # The MILP point of any feasible plan satisfies every row and its objective is evaluate(plan).
    program = random_case(seed)
    reference = solve_reference(program)
    if reference is None:
        return
    form = Formulation(program, reduce_program(program, fold=False))
    x = form.encode(reference.stage_of, reference.strategy_of)
    model = form.model
    activity = model.activity(x)
    assert np.all(activity >= model.row_lo - 1e-7) and np.all(activity <= model.row_hi + 1e-7)
    assert np.all(x >= model.lb - 1e-9) and np.all(x <= model.ub + 1e-9)
    assert model.cost @ x * form.scale == pytest.approx(reference.objective, rel=1e-9)
    decoded = form.decode(x)
    assert evaluate(program, decoded.stage_of, decoded.strategy_of) == pytest.approx(reference.objective, rel=1e-9)


def test_cutoff():
    program = random_program(4, layers=7, strategies=3, stages=2, runs=[1, 5, 1])
    best = solve(program)
    assert solve(program, cutoff=best.objective * 0.999) is None
    assert solve_outcome(program, cutoff=best.objective * 0.999).status == "cutoff"
    assert solve(program, cutoff=best.objective * 1.01).objective == pytest.approx(best.objective)


def test_time_limit_returns_incumbent_or_none():
    program = random_program(7, layers=40, strategies=4, stages=4, runs=[1] * 40, memory=200.0)
    outcome = solve_outcome(program, fold=False, time_limit=0.2)
    if outcome.solution is None:
        assert outcome.status == "timeout"
    else:
        sol = outcome.solution
        assert not sol.optimal and sol.gap > 0 and outcome.status == "feasible"
        assert sol.objective == pytest.approx(evaluate(program, sol.stage_of, sol.strategy_of))


def test_mip_gap_allows_early_stop():
    program = random_program(8, layers=7, strategies=3, stages=2)
    loose, exact = solve(program, mip_gap=0.5), solve(program)
    assert exact.objective <= loose.objective * (1 + 1e-9) <= exact.objective * 1.5 * (1 + 1e-9)
    assert loose.gap <= 0.5


def test_unknown_or_missing_solver():
    program = random_program(0, layers=3, strategies=2, stages=1)
    with pytest.raises(UniapError, match="unknown solver"):
        solve(program, solver="cplex")
    if importlib.util.find_spec("gurobipy") is None:
        with pytest.raises(UniapError, match="gurobipy"):
            solve(program, solver="gurobi")


def test_highs_prints_nothing(capfd):
    solve(random_program(9, layers=4, strategies=2, stages=2))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_single_stage_and_single_strategy():
    program = random_program(11, layers=5, strategies=1, stages=1, memory=None)
    sol = solve(program)
    assert sol.optimal and list(sol.stage_of) == [0] * 5
    assert sol.objective == pytest.approx(solve_reference(program).objective)
    assert math.isfinite(sol.time_s) and sol.solver == "highs"


@pytest.fixture
def targets(monkeypatch) -> list:
    """The objective target of every HiGHS solve the test makes (None: no target)."""
    from uniap.solve.backends import HighsBackend

    seen = []
    solve_ = HighsBackend.solve

    def spy(self, time_limit, cutoff, mip_gap, target=None):
        seen.append(target)
        return solve_(self, time_limit, cutoff, mip_gap, target)

    monkeypatch.setattr(HighsBackend, "solve", spy)
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_a_known_bound_stops_the_milp_at_a_plan_that_attains_it(seed, targets):
    """Given the optimum as a proven bound (`known`), the chunk MILP stops at the first point that reaches it
    (HiGHS's objective target) and returns that plan as optimal, at the oracle's optimum; a plan that would
    only attain a bound below the optimum is never returned as optimal."""
    program = random_program(400 + seed, layers=7, stages=2, virtual_stages=2, memory=None)
    reference = solve_reference(program)
    found = solve_outcome(program, phase="chunks", known=reference.objective)
    assert found.status == "optimal" and found.solution.optimal
    assert found.solution.objective == pytest.approx(reference.objective, rel=1e-6)
    assert any(t is not None for t in targets)
    low = solve_outcome(program, phase="chunks", known=reference.objective * 0.95)
    assert low.solution.objective == pytest.approx(reference.objective, rel=1e-6)
    assert low.solution.optimal == (low.solution.gap <= 1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_a_known_bound_stops_the_device_group_relaxations(seed, targets):
    """With a proven bound, each device-group relaxation stops at its first point at or under it (it cannot raise
    the bound then); the interleaved program still comes back at the oracle's optimum, proven only where a plan
    attains the bound, whether the bound is the optimum or below it."""
    program = random_program(500 + seed, layers=7, stages=2, virtual_stages=2, memory=None)
    reference = solve_reference(program)
    for known in (reference.objective, reference.objective * 0.95):
        targets.clear()
        found = solve_outcome(program, known=known)
        assert found.solution.objective == pytest.approx(reference.objective, rel=1e-6)
        assert found.solution.optimal
        assert targets and all(t is not None for t in targets)
