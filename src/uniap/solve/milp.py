"""Solve one pipeline configuration exactly: `solve(program) -> Solution | None`.

Linear back-ends (HiGHS by default, Gurobi when importable) get the folded MILP of formulation.py and a sub-tour
cut loop around it: solve, turn the point into a plan, and if a segment's transitions held a sub-tour, add the
connectivity cuts and solve again, for a plan better than the repaired one. An interleaved program is first bounded
by dynamic programming over its device groups (group_bound.py), then solved by device group
(group_relaxation.py): its optimum bounds every plan, and when a plan with those group contents attains it, that
plan is optimal without the chunk MILP's branching through near-equal chunk splits (where a repeating pattern
of different layers folds only in the chunk MILP, that MILP is solved straight away: `_chunk_runs`). SCIP gets
the native quadratic form (quadratic.py). Whatever the back-end, the returned objective is `evaluate` of the
returned plan.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import time
from dataclasses import dataclass

import numpy as np

from uniap.errors import UniapError
from uniap.solve.backends import HIGHS_SMALL, IIS_TIME_S, GurobiBackend, HighsBackend
from uniap.solve.bounds import partition_bound
from uniap.solve.formulation import BOUNDS, Formulation, scale_of
from uniap.solve.group_bound import group_bound
from uniap.solve.group_relaxation import GroupRelaxation, chain_plan
from uniap.solve.linear import conflict_line
from uniap.program import StageProgram
from uniap.solve.guesses import stagewise_guess
from uniap.solve.program import Solution, evaluate, lower_bound
from uniap.solve.reduce import Reduced, reduce_program
from uniap.solve.split_bound import split_group_bound

SOLVERS = {"highs": "highspy", "scip": "pyscipopt", "gurobi": "gurobipy"}
"""Back-end name → the module it needs."""

OPTIMAL_RTOL = 1e-6
"""A plan within this relative gap of the proven bound counts as optimal."""


@dataclass(frozen=True)
class Outcome:
    """What one solve established: the plan (if any) and why there is none otherwise."""

    solution: Solution | None
    status: str  # "optimal" | "feasible" (limit hit, plan kept) | "infeasible" | "cutoff" | "timeout" (no plan)
    #            | "deferred" (asked to: the step `phase` settled nothing, and `bound` is what it proved)
    bound: float = -math.inf
    phase: str | None = None  # where a deferred solve stopped: "bound" or "relaxation"


class InfeasibleError(UniapError):
    """No plan satisfies a program's rows. The message names the kinds of rows that conflict where HiGHS found an
    irreducible infeasible subset (`explain_infeasible`), in one line."""


def solve(program: StageProgram, solver: str = "highs", time_limit: float | None = None,
          cutoff: float | None = None, fold: bool = True, mip_gap: float = 0.0,
          explain: bool = False) -> Solution | None:
    """The minimum-TPI plan of `program`, or None.

    None when no plan is feasible, when no plan beats `cutoff` (a TPI the caller already has; ties may go either
    way), or when `time_limit` seconds pass before any plan is found. On a time limit with a plan in hand, the plan
    comes back with optimal=False and its relative gap to the proven bound. `mip_gap` > 0 lets the solver stop
    that close to the bound. `fold` (linear back-ends) folds runs of identical layers, merges layout classes and
    drops dominated strategies; fold=False is the plain one-binary-per-layer form. SCIP always solves the
    unfolded native quadratic form. `explain` raises InfeasibleError instead of returning None when no plan is
    feasible at all, its message naming the kinds of rows that conflict (`explain_infeasible`).
    """
    outcome = solve_outcome(program, solver=solver, time_limit=time_limit, cutoff=cutoff, fold=fold,
                            mip_gap=mip_gap)
    if explain and outcome.status == "infeasible":
        raise InfeasibleError(explain_infeasible(program, fold=fold) or
                              "infeasible: no plan satisfies the program (no conflicting rows were identified)")
    return outcome.solution


def explain_infeasible(program: StageProgram, fold: bool = True, time_limit: float | None = IIS_TIME_S) -> str | None:
    """One line naming the kinds of MILP rows that conflict in an infeasible program, with their indices and
    counts: "infeasible: memory[stage=0..1] (2 rows) conflict with run_placed[run=0..5] (6 rows) and the bounds
    of …". It comes from the irreducible infeasible subset HiGHS finds in the program's chunk MILP
    (formulation.py; the rows are named by meaning there). None where the program has a plan, or where no subset
    comes back: highspy is missing, its IIS fails, or `time_limit` seconds (for the solve and again for the
    subset) run out first. The search never calls this: it costs a MILP solve and a sub-MIP per row it drops."""
    if importlib.util.find_spec("highspy") is None:
        return None
    program.validate()
    reduced = reduce_program(program, fold=fold)
    empty = [run.first for run in reduced.runs if len(run.keep) == 0]
    if empty:
        return f"infeasible: no strategy is allowed for layer {empty[0]} ({len(empty)} layer(s) without one)"
    model = Formulation(program, reduced).model
    backend = HighsBackend(model)
    if backend.solve(time_limit, None, 0.0).status != "infeasible":
        return None
    found = backend.conflict(time_limit)
    if found is not None:
        return "infeasible: " + conflict_line(*found, meaning=BOUNDS)
    kinds = _conflicting_kinds(model, time_limit)
    if kinds is None:
        return None
    counts = model.kinds()
    parts = [f"{kind} ({counts[kind]} row{'s' if counts[kind] != 1 else ''})" for kind in kinds]
    line = parts[0] + (" conflict with " + ", ".join(parts[1:]) if len(parts) > 1 else " conflict with the bounds")
    return f"infeasible: {line} (whole kinds: HiGHS found no irreducible subset)"


def _conflicting_kinds(model, time_limit: float | None) -> list[str] | None:
    """Where HiGHS finds no irreducible infeasible subset: a set of kinds of rows whose rows together (with the
    column bounds) are infeasible and none of which can be left out, by dropping each kind in turn (a deletion
    filter over kinds, one MILP per kind). None when a MILP runs past the time left."""
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    kinds = np.array([kind for kind, _ in model.names])
    needed = list(model.kinds())
    for kind in list(needed):
        left = _remaining(deadline)
        if left is not None and left <= 0:
            return None
        trial = [k for k in needed if k != kind]
        result = HighsBackend(model.only(np.isin(kinds, trial))).solve(left, None, 0.0)
        if result.status == "infeasible":
            needed = trial  # infeasible without this kind: it is not needed
        elif result.status != "optimal":
            return None
    return needed


def solve_outcome(program: StageProgram, solver: str = "highs", time_limit: float | None = None,
                  cutoff: float | None = None, fold: bool = True, mip_gap: float = 0.0,
                  phase: str | None = None, known: float | None = None) -> Outcome:
    """`solve`, also saying why no plan came back (the UOP records it). `phase` (interleaved programs) lets the
    UOP solve a candidate in steps, in the order of the bound each step leaves, with the best incumbent: "bound"
    stops after the group bound (solve.group_bound, exact then; zero bubble: solve.split_bound) and
    "relaxation" after the device-group MILPs (zero bubble: its chunk MILP), each coming back "deferred" with
    that bound unless it settles the candidate; "chunks" goes straight to the chunk MILP (the device-group MILPs
    ran and settled nothing). `known`: a lower bound the caller already has
    (the UOP's, from bounding the candidate), taken instead of `lower_bound` again."""
    if solver not in SOLVERS:
        raise UniapError(f"unknown solver '{solver}' (choose from {', '.join(SOLVERS)})")
    if importlib.util.find_spec(SOLVERS[solver]) is None:
        raise UniapError(f"solver '{solver}' needs the Python package {SOLVERS[solver]}, which is not installed")
    program.validate()
    started = time.perf_counter()
    deadline = None if time_limit is None else started + float(time_limit)
    bound = lower_bound(program) if known is None else known
    # v = 1: runs that repeat a pattern fold too (reduce.py); the device-group bounds of v > 1 take plain runs
    folded = functools.cache(lambda: reduce_program(program, fold=True, periodic=program.virtual_stages == 1))
    grouped = program.split_schedule is None  # partition and group bounds: the (interleaved) 1F1B formulas only
    if cutoff is not None and bound < cutoff and program.stages > 1 and grouped:
        # A stronger bound before the MILP. One stage has no min-max term for it to tighten: there the MILP itself
        # is faster. Plain pipelines: integral stage contents (~0.1-0.5 s); interleaved ones: integral group
        # contents (~0.05 s; group_bound), then their device-group MILPs (_by_group).
        if program.virtual_stages == 1:
            bound = max(bound, partition_bound(program, cutoff))
        elif (by_group := group_bound(program, folded, cutoff)) is not None:
            bound = max(bound, by_group)
            if phase == "bound" and bound < cutoff:  # solved later, in the order of its exact bound
                exact, contents = group_bound(program, folded, contents=True)
                bound = max(bound, exact)
                plan, value = (None, math.inf) if contents is None else \
                    chain_plan(program, folded(), contents, bound * (1 + OPTIMAL_RTOL))
                found = None if value >= cutoff else _solution(plan, value, bound, started, solver)
                if found is not None and found.optimal:  # a plan attains it: optimal, no MILP
                    return Outcome(found, "optimal")
                return Outcome(found, "deferred", bound, "bound")
    if not grouped and program.pipeline_degree > 1 and (cutoff is None or bound < cutoff):
        # zero bubble: the busiest device group's work, by its contents (~0.02 s), before the chunk MILP; in
        # the "bound" phase the candidate then waits in the queue with it. Again before the chunk MILP, then with
        # the whole-block group bound: under a cut-off the group bound is a cheaper relaxation, and one taken
        # under the search's first cut-off can stay below a later one that the exact bound passes (Nemotron-4
        # 340B, 128 H100, fp8: pp16·v3 zero bubble, bounded at 3.538 s under a cut-off of 3.623 s, is 3.620 s
        # by the exact bound; its chunk MILP took 15-18 s to be cut off at 3.557 s)
        by_contents = split_group_bound(program, bound, cutoff)
        bound = bound if by_contents is None else max(bound, by_contents)
        if program.virtual_stages > 1 and (cutoff is None or bound < cutoff):
            # whole blocks per chunk over a level (~0.02 s), where the contents' bound charges only the work
            by_group = group_bound(program, folded, cutoff if phase == "bound" else None)
            bound = bound if by_group is None else max(bound, by_group)
        if phase == "bound" and by_contents is not None and (cutoff is None or bound < cutoff) \
                and bound < math.inf:
            return Outcome(None, "deferred", bound, "bound")
    if bound == math.inf:
        return Outcome(None, "infeasible")
    if cutoff is not None and bound >= cutoff:
        return Outcome(None, "cutoff")
    if solver == "scip" and (program.virtual_stages > 1 or not grouped):
        raise UniapError("the SCIP back-end solves plain pipelines only; interleaved and zero-bubble programs need "
                         "highs or gurobi")
    if solver == "scip":
        status, plan, best_bound = _scip(program, deadline, cutoff, mip_gap)
    else:
        backend = HighsBackend if solver == "highs" else GurobiBackend
        reduced = folded() if fold else reduce_program(program, fold=False)
        # A candidate the group bound cannot defer (no cut-off yet, or a chain it does not cover) may still be
        # deferred after its device-group MILPs.
        step = "relaxation" if phase == "bound" else phase
        status, plan, best_bound = _linear(program, reduced, backend, deadline, cutoff, mip_gap, step, bound,
                                           _chunk_runs(program, reduced) if fold else None)
        if status == "deferred":  # with the best direct plan of the device-group contents, if one beats the cutoff
            value = evaluate(program, *plan) if plan is not None else math.inf
            bound = max(best_bound, bound)
            found = None if cutoff is not None and value >= cutoff else \
                _solution(plan, value, bound, started, solver, proven=False)
            return Outcome(found, "deferred", bound, "relaxation")
    value = evaluate(program, *plan) if plan is not None else math.inf
    if plan is None or (cutoff is not None and value >= cutoff):
        if status == "infeasible":
            return Outcome(None, "cutoff" if cutoff is not None else "infeasible")
        return Outcome(None, "cutoff" if status == "optimal" else "timeout")
    solution = _solution(plan, value, max(best_bound, bound), started, solver, proven=status == "optimal")
    return Outcome(solution, "optimal" if solution.optimal else "feasible")


def _solution(plan, value: float, bound: float, started: float, solver: str, proven: bool = True) -> Solution | None:
    """The Solution of a plan of TPI `value` against a proven lower `bound`: optimal when it is `proven` (the
    solve ran to its end) and attains the bound; None without a plan."""
    if plan is None or not math.isfinite(value):
        return None
    gap = max(0.0, (value - bound) / value) if value > 0 else 0.0
    optimal = proven and gap <= OPTIMAL_RTOL
    return Solution(stage_of=plan[0], strategy_of=plan[1], objective=value, optimal=optimal,
                    gap=0.0 if optimal else gap, time_s=time.perf_counter() - started, solver=solver)


def _chunk_runs(program: StageProgram, plain: Reduced) -> Reduced | None:
    """The runs of an interleaved or zero-bubble program's chunk MILP (v > 1) where they fold further than the
    `plain` runs the device-group steps take: a stretch that repeats a pattern of different layers is one
    periodic run (reduce.py). GPT-OSS 120B alternates sliding-window and full attention, so its 36 blocks are 36
    plain runs; with batch 1,280, its pp4·v2 candidate (80 micro-batches) ran its coarse device-group MILP
    (22,363 columns) for the whole 120 s limit, where the chunk MILP over one periodic run proves in 2 s that it
    loses (over plain runs: 24 s). None where nothing folds further, or where a pattern holds a stretch of
    identical layers: a device group runs such a stretch under one strategy, which phases do not say."""
    single, most = 0, 0  # a pattern of p ≥ 2 different layers seen twice is 4 or more plain runs of one layer
    for run in plain.runs:
        single = single + 1 if run.length == 1 else 0
        most = max(most, single)
    if program.virtual_stages == 1 or most < 4:
        return None
    periodic = reduce_program(program, fold=True, periodic=True)
    if len(periodic.runs) == len(plain.runs):
        return None
    for run in periodic.runs:
        if run.period > 1 and any(other.length > 1 for other in plain.runs if run.first <= other.first <= run.last):
            return None
    return periodic


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.perf_counter(), 0.0)


def _linear(program, reduced, backend_cls, deadline, cutoff, mip_gap, phase=None, known=-math.inf, chunks=None):
    """Sub-tour cut loop. Returns (status, plan, lower bound in seconds); status "optimal" only when the last MILP
    was solved to optimality and its point needed no repair, or when its plan attains `known` (a proven bound:
    the MILP stops at the first point that reaches it, where proving it again could take longer than finding
    it: Nemotron-4 340B's pp8·v6 on 128 H100 took 16 s to prove the plan its group bound attains, 8 s to find
    it); "deferred" (in `phase` "relaxation") where the device-group MILPs leave the program to the chunk MILP.
    `chunks`: the runs of an interleaved program's chunk MILP where they fold further than `reduced`
    (`_chunk_runs`); the device-group MILPs, which take plain runs, are then not solved."""
    if any(len(run.keep) == 0 for run in reduced.runs):
        return "infeasible", None, math.inf
    formulation = functools.cache(lambda: Formulation(program, reduced))  # built only once it is needed
    best, best_value, bound = None, math.inf, -math.inf
    if program.virtual_stages > 1 and phase != "chunks" and program.split_schedule is None and chunks is None:
        status, bound, arranged, nearest = _by_group(program, reduced, formulation, backend_cls, deadline, cutoff,
                                                     known)
        if status != "optimal" or arranged is not None:
            return status, arranged if arranged is not None else nearest, bound
        if phase == "relaxation":
            return "deferred", nearest, bound
        if nearest is not None:  # the chunk MILP looks for better than the best direct plan
            best, best_value = nearest, evaluate(program, *nearest)
    elif (guess := stagewise_guess(program)) is not None:  # v = 1 only
        # A plain or zero-bubble pipeline's MILP looks for better than its stagewise plan: HiGHS finds good
        # points of a chain that does not fold slowly (GPT-OSS 120B's pp8 zero bubble: six minutes to reach it).
        best, best_value = (guess.stage_of, guess.strategy_of), guess.objective
    if best is not None and (cutoff is None or best_value < cutoff):
        cutoff = best_value  # only a better plan is worth finding; none then proves this one optimal
    form = formulation() if chunks is None else Formulation(program, chunks)
    tau = form.scale
    backend = backend_cls(form.model)
    attained = known * (1 + OPTIMAL_RTOL)  # a plan at most this is optimal
    target = _target(known, tau)
    while True:
        remaining = _remaining(deadline)
        if remaining is not None and remaining <= 0:
            return "limit", best, bound
        if best_value <= attained:
            return "optimal", best, known
        result = backend.solve(remaining, None if cutoff is None else cutoff / tau, mip_gap, target)
        if result.x is None:  # "infeasible": nothing (better than the cutoff) exists; or "limit"
            if result.status == "infeasible" and best is not None and best_value <= cutoff:
                return "optimal", best, best_value  # the cutoff was this plan's own value
            return result.status, best, bound
        bound = max(bound, result.bound * tau)
        decoded = form.decode(result.x)
        plan = (decoded.stage_of, decoded.strategy_of)
        value = evaluate(program, *plan)
        if value < best_value:
            best, best_value = plan, value
            cutoff = value if cutoff is None else min(cutoff, value)
        if result.status == "target":
            if best_value <= attained:
                return "optimal", best, known
            target = None  # its point under-stated its plan: solve on to the proof
            continue
        if not decoded.subtours:
            return result.status, best, bound
        if result.status != "optimal":
            return "limit", best, bound
        backend.add_rows(form.cuts(decoded.subtours))


def _by_group(program, reduced, formulation, backend_cls, deadline, cutoff, known=-math.inf):
    """Solve the device-group relaxations, and look for a plan with their group contents that attains them.

    First the coarse relaxation (no edge counts: cheapest to cut off) and the direct construction, with the
    resharding at the chain's ends where an end can reshard (what the coarse bound most often misses: llama2-70b's
    head reshards from its blocks, and the edge counts took 0.6 s to see it where this takes 0.2 s); then, if
    that does not attain it, the one with edge counts, the direct construction and the chunk MILP with its group
    contents fixed. Returns (status, bound in seconds, plan, nearest): ("optimal", bound, plan, _) when the plan
    attains the bound (it is optimal); ("optimal", bound, None, nearest) when none does (the chunk MILP must
    decide, knowing the bound, from the best direct plan `nearest` when one beat `cutoff`); ("infeasible", inf,
    None, None) when no plan fits or beats `cutoff`; ("limit", bound, None, nearest) on the time limit.

    `known`, a bound already proven (the exact group bound): a relaxation stops at its first point at or under
    it, since it cannot then raise the bound; that point's contents may still hold a plan that attains `known`.
    (Nemotron-4 340B's pp8·v7 on 128 H100 spent 18 s proving a relaxation of 3.373 s under its group bound of
    3.506 s.)"""
    tau, bound = scale_of(program, reduced), known
    nearest, nearest_value = None, math.inf if cutoff is None else cutoff
    target = _target(known, tau)
    for edges in (False, True):
        relaxation = GroupRelaxation(program, reduced, tau, edges)
        backend = HighsBackend(relaxation.model, HIGHS_SMALL) if backend_cls is HighsBackend and not edges \
            else backend_cls(relaxation.model)
        result = backend.solve(_remaining(deadline), None if cutoff is None else cutoff / tau, 0.0, target)
        # With a cut-off, HiGHS may return a point above it: then nothing below it exists.
        if result.status == "infeasible" or (cutoff is not None and result.x is not None
                                             and result.bound * tau >= cutoff):
            return "infeasible", math.inf, None, None
        if result.status not in ("optimal", "target"):
            return "limit", max(bound, result.bound * tau), None, nearest
        bound = max(bound, result.bound * tau)
        contents = relaxation.contents(result.x)
        direct, value = chain_plan(program, reduced, contents, bound * (1 + OPTIMAL_RTOL))
        if value < nearest_value:
            nearest, nearest_value = direct, value
        plan = direct if value <= bound * (1 + OPTIMAL_RTOL) else \
            _attaining(program, reduced, formulation if edges else None, backend_cls, contents, bound, deadline)
        if plan is not None:
            return "optimal", bound, plan, None
    return ("limit" if _remaining(deadline) == 0 else "optimal"), bound, None, nearest


def _attaining(program, reduced, formulation, backend_cls, contents, bound: float, deadline):
    """A plan holding the given device-group contents whose TPI attains `bound`, or None (the direct
    construction, group_relaxation.chain_plan, did not): given a `formulation`, the chunk MILP with those
    contents fixed, cut off just above the bound."""
    if formulation is None:
        return None
    form = formulation()
    arrange = backend_cls(form.model)
    arrange.add_rows(form.group_rows(contents))
    target = _target(bound, form.scale)
    found = arrange.solve(_remaining(deadline), target, 0.0, target)
    if found.x is None:
        return None
    decoded = form.decode(found.x)
    plan = (decoded.stage_of, decoded.strategy_of)
    return plan if evaluate(program, *plan) <= bound * (1 + OPTIMAL_RTOL) else None


def _target(known: float, scale: float) -> float | None:
    """The objective (in the model's units, seconds / `scale`) at which a point's plan attains the proven bound
    `known` (seconds): a solve may stop at the first such point. None without a positive finite bound."""
    return known * (1 + OPTIMAL_RTOL / 2) / scale if math.isfinite(known) and known > 0 else None


def _scip(program, deadline, cutoff, mip_gap):
    from uniap.solve.quadratic import ScipQuadratic

    bound = lower_bound(program)
    scale = bound if bound > 0 else 1.0
    model = ScipQuadratic(program, scale)
    status, plan, lower = model.solve(_remaining(deadline), None if cutoff is None else cutoff / scale, mip_gap)
    return status, plan, lower * scale
