"""The unified optimisation process (UOP): solve every pipeline configuration, keep the fastest.

Candidates (e.g. (pipeline degree, micro-batch count) pairs) are independent programs. They are ordered by a
cheap lower bound on their TPI and solved most promising first, each with the best TPI found so far as cut-off,
so a candidate that cannot win is dropped: before solving when its cheap bound already loses, or inside `solve`
by the stronger partition bound or the MILP itself. An interleaved candidate that its group bound does not cut
off goes back in the queue with that bound, and its MILPs run only once the candidates that may beat it are
settled.
"""

from __future__ import annotations

import bisect
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from uniap.solve import backends
from uniap.solve.milp import Outcome, solve_outcome
from uniap.solve.program import Solution, StageProgram, evaluate_many, lower_bound

PROVEN = ("optimal", "cutoff", "infeasible", "impossible", "skipped")
"""Statuses that settle a candidate: nothing better can hide in it."""


@dataclass(frozen=True)
class CandidateRecord:
    candidate: Hashable
    lower_bound: float  # cheap bound on its TPI (inf when impossible or provably infeasible)
    objective: float | None  # TPI of its best plan, if one was found
    status: str  # optimal | feasible (time limit, gap) | cutoff | infeasible | impossible | skipped | timeout
    time_s: float  # solver time (0 when not solved)


@dataclass(frozen=True)
class SearchResult:
    best: Hashable | None  # the winning candidate (None: nothing feasible)
    solution: Solution | None  # its plan
    total: int  # candidates given
    solved: int  # handed to the solver
    skipped: int  # not solved: their lower bound could not beat the incumbent
    time_s: float
    optimal: bool  # every candidate settled (proven optimal, beaten, infeasible or skipped by a bound)
    gap: float  # relative gap between the best TPI and the least lower bound over all candidates
    records: list[CandidateRecord]
    unbounded: int = 0  # candidates the time limit left unbuilt (nothing known of them)


PHASES = ("bound", "relaxation", "chunks")
"""The steps of an interleaved candidate's solve, each after the candidates whose bounds are lower have been
settled (solve.milp.solve_outcome; a plain candidate is solved whole in the first)."""
SERIAL_BUDGET_S = 1.0
"""Seconds of solving done in this process before worker processes may be started for the rest."""
WORKER_START_S = 0.5
"""What starting the worker pool costs here (spawned processes importing numpy and HiGHS)."""


def search(candidates: Sequence[Hashable], build: Callable[[Hashable], StageProgram | None], *,
           solver: str = "highs", time_limit: float | None = None, workers: int | None = None,
           progress: Callable[[int, int, float], None] | None = None,
           tier: Callable[[StageProgram], int] | None = None) -> SearchResult:
    """Solve every candidate's program (build(candidate); None means impossible) and return the best.

    `time_limit` bounds the whole search (seconds): each solve gets what is left, candidates not started by then
    are recorded as "timeout". `workers` > 1 solves in that many processes (default min(cpu count, 2)).
    `progress(done, total, best_objective)` is called after each candidate is settled. `build` runs in this
    process, once to bound a candidate and again to solve it (programs are megabytes each: they are rebuilt
    rather than all held at once), so it should be deterministic. Candidates are solved in order of
    (`tier(program)`, lower bound): a lower tier first, so candidates whose bound is weak but whose MILP is hard
    (interleaved pipelines: v chunks per device group) start with the incumbent the easier ones found.
    """
    started = time.perf_counter()
    deadline = None if time_limit is None else started + float(time_limit)
    workers = min(os.cpu_count() or 1, 2) if workers is None else max(1, int(workers))
    records: dict[int, CandidateRecord] = {}
    queue: list[tuple[int, float, int]] = []  # (tier, lower bound, candidate index)
    guess: tuple[int, Solution] | None = None
    unbounded: list[int] = []  # not even built before the deadline (a plan was in hand already)
    for index, candidate in enumerate(candidates):
        if deadline is not None and guess is not None and time.perf_counter() >= deadline:
            unbounded.append(index)
            continue
        program = build(candidate)
        if program is None:
            records[index] = CandidateRecord(candidate, math.inf, None, "impossible", 0.0)
            continue
        program.validate()
        bound = lower_bound(program)
        if bound == math.inf:
            records[index] = CandidateRecord(candidate, math.inf, None, "infeasible", 0.0)
            continue
        queue.append((tier(program) if tier else 0, bound, index))
        if guess is not None and bound >= guess[1].objective:
            continue  # its uniform plan costs at least its bound: it cannot be the better incumbent
        uniform = uniform_guess(program)
        if uniform is not None and (guess is None or uniform.objective < guess[1].objective):
            guess = (index, uniform)
    queue.sort()
    state = _State(candidates, records, progress)
    state.unbounded = len(unbounded)
    for index in unbounded:  # nothing is known of them: their floor is 0, so the gap says so
        records[index] = CandidateRecord(candidates[index], 0.0, None, "timeout", 0.0)
        state.floors[index] = 0.0
    if guess is not None:  # an incumbent before any MILP: solves then only look for something better
        state.best_index, state.best = guess
    state.report_settled()
    # Serially first: most searches settle in a few solves, and starting worker processes costs WORKER_START_S.
    # After SERIAL_BUDGET_S of solving, what is left goes to the workers if it is worth more than that.
    serial_until = math.inf if workers == 1 else time.perf_counter() + SERIAL_BUDGET_S
    solve_times: list[float] = []
    build_times: list[float] = []  # this process builds every program, for the workers too
    while queue:
        if time.perf_counter() >= serial_until:
            if _worth_workers(queue, state, solve_times, build_times, workers):
                break
            serial_until = math.inf
        tier_of, bound, index = queue.pop(0)
        if state.skip(index, bound, deadline):
            continue
        build_started = time.perf_counter()
        program = build(candidates[index])
        solve_started = time.perf_counter()
        build_times.append(solve_started - build_started)
        outcome = solve_outcome(program, solver=solver, time_limit=_left(deadline),
                                cutoff=state.cutoff(), phase=state.phase(index))
        solve_times.append(time.perf_counter() - solve_started)
        if not state.defer(queue, (tier_of, bound, index), outcome, solve_times[-1]):
            state.settle(index, bound, outcome, solve_times[-1] + state.deferred.get(index, 0.0))
    if queue:
        _parallel(queue, build, state, solver, deadline, workers)
    ordered = [records[i] for i in range(len(candidates))]
    return state.result(ordered, time.perf_counter() - started)


def uniform_guess(program: StageProgram) -> Solution | None:
    """The best hand-style plan of a program: even split by layer count, one strategy for every layer (a layer
    that cannot take it keeps its fastest allowed one). Costs one vectorised evaluate; None if none fits."""
    L, K, P = program.layers, program.strategies, program.stages
    ok = np.asarray(program.allowed)
    fastest = np.where(ok, np.asarray(program.A, dtype=float), math.inf).argmin(axis=1)
    strategies = np.where(ok.T, np.arange(K)[:, None], fastest[None, :])
    stage_of = np.arange(L) * P // L
    values = evaluate_many(program, stage_of, strategies)
    k = int(np.argmin(values))
    if not math.isfinite(values[k]):
        return None
    return Solution(stage_of=stage_of, strategy_of=strategies[k], objective=float(values[k]), optimal=False,
                    gap=math.inf, time_s=0.0, solver="uniform")


def _worth_workers(queue, state: "_State", solve_times: list[float], build_times: list[float],
                   workers: int) -> bool:
    """Would `workers` processes save more than starting them costs? The candidates left that can still beat the
    incumbent, at the median solve time so far (one long solve of the winner says little of the rest), shared by
    the workers instead of solved one after the other. This process still builds (and sends) every program, so
    only what a solve takes beyond its build can run beside it: where solves are cheap bounds, workers lose."""
    cutoff = state.cutoff()
    left = sum(1 for entry in queue if cutoff is None or entry[1] < cutoff)
    typical = float(np.median(solve_times)) if solve_times else 0.0
    beside = max(typical - (float(np.median(build_times)) if build_times else 0.0), 0.0)
    return left * beside * (1 - 1 / workers) > WORKER_START_S


def _parallel(queue, build, state: "_State", solver: str, deadline: float | None, workers: int) -> None:
    """Keep `workers` solves in flight, each cut off at the incumbent of the moment it starts. A candidate of a
    higher tier waits until every solve of a lower tier has settled, so it starts with their incumbent, and a
    deferred one until every solve in flight has (they come in the order of their bounds, and most are skipped
    once the first is solved)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold solver threads
    pending = list(queue)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=backends.limit_threads,
                             initargs=(1,)) as pool:
        running: dict[Future, tuple[int, float, float, int]] = {}
        while pending or running:
            while pending and len(running) < workers:
                if running and pending[0][0] > max(entry[3] for entry in running.values()):
                    break  # the next tier waits for the incumbent of this one
                if running and pending[0][2] in state.deferred:
                    break  # a deferred candidate's MILPs are long: the solves before it may well skip it
                tier, bound, index = pending.pop(0)
                if state.skip(index, bound, deadline):
                    continue
                future = pool.submit(solve_outcome, build(state.candidates[index]), solver=solver,
                                     time_limit=_left(deadline), cutoff=state.cutoff(),
                                     phase=state.phase(index))
                running[future] = (index, bound, time.perf_counter(), tier)
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                index, bound, submitted, tier = running.pop(future)
                seconds = time.perf_counter() - submitted
                if not state.defer(pending, (tier, bound, index), future.result(), seconds):
                    state.settle(index, bound, future.result(), seconds + state.deferred.get(index, 0.0))


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.perf_counter(), 0.0)


class _State:
    """The incumbent and the records, shared by the serial and the parallel loop."""

    def __init__(self, candidates, records: dict[int, CandidateRecord], progress):
        self.candidates, self.records, self.progress = candidates, records, progress
        self.best_index: int | None = None
        self.best: Solution | None = None
        self.floors: dict[int, float] = {}  # proven lower bound on each candidate's TPI, where not inf
        self.solved = 0
        self.skipped = 0
        self.unbounded = 0
        self.deferred: dict[int, float] = {}  # candidates sent back, with the seconds their solves took so far
        self.deferrals: dict[int, int] = {}  # how many of its PHASES each has gone through

    def cutoff(self) -> float | None:
        return None if self.best is None else self.best.objective

    def report_settled(self) -> None:
        for _ in range(len(self.records)):
            self._tick()

    def skip(self, index: int, bound: float, deadline: float | None) -> bool:
        """Record and report a candidate that needs no solve: its bound loses, or time is up."""
        candidate = self.candidates[index]
        if self.best is not None and bound >= self.best.objective:
            self.records[index] = CandidateRecord(candidate, bound, None, "skipped", 0.0)
            self.skipped += 1
        elif deadline is not None and time.perf_counter() >= deadline:
            self.records[index] = CandidateRecord(candidate, bound, None, "timeout", 0.0)
            self.floors[index] = bound
        else:
            return False
        self._tick()
        return True

    def phase(self, index: int) -> str:
        """The step a candidate's next solve takes (solve.milp.solve_outcome): up to its group bound at first,
        then up to its device-group MILPs, then its chunk MILP; each after the step its last solve stopped at."""
        return PHASES[min(self.deferrals.get(index, 0), len(PHASES) - 1)]

    def defer(self, queue: list, entry: tuple[int, float, int], outcome: Outcome, seconds: float) -> bool:
        """Put a deferred candidate back in the queue, in order, with the bound it now has: it is solved further
        after the candidates that may beat it, or skipped if one does."""
        if outcome.status != "deferred":
            return False
        tier, bound, index = entry
        self.deferred[index] = self.deferred.get(index, 0.0) + seconds
        self.deferrals[index] = PHASES.index(outcome.phase) + 1  # its next solve takes the step after it
        if self.phase(index) == "chunks":
            tier += 1  # a chunk MILP is long and its bound weak: every cheaper step first, for a better cut-off
        bisect.insort(queue, (tier, max(bound, outcome.bound), index))
        return True

    def settle(self, index: int, bound: float, outcome: Outcome, seconds: float) -> None:
        self.solved += 1
        sol = outcome.solution
        self.records[index] = CandidateRecord(self.candidates[index], bound, sol.objective if sol else None,
                                              outcome.status, seconds)
        if outcome.status == "timeout":
            self.floors[index] = bound
        elif sol is not None:
            self.floors[index] = sol.objective * (1.0 - sol.gap)
        if sol is not None and (self.best is None or sol.objective < self.best.objective):
            self.best_index, self.best = index, sol
        self._tick()

    def _tick(self) -> None:
        if self.progress is not None:
            best = self.best.objective if self.best is not None else math.inf
            self.progress(len(self.records), len(self.candidates), best)

    def result(self, records: list[CandidateRecord], seconds: float) -> SearchResult:
        best = self.best.objective if self.best is not None else math.inf
        floor = min(self.floors.values(), default=math.inf)
        if self.best is None:
            gap = 0.0 if floor == math.inf else math.inf
        else:
            gap = max(0.0, (best - min(floor, best)) / best) if best > 0 else 0.0
        return SearchResult(
            best=self.candidates[self.best_index] if self.best_index is not None else None, solution=self.best,
            total=len(records), solved=self.solved, skipped=self.skipped, time_s=seconds,
            optimal=all(r.status in PROVEN for r in records), gap=gap, records=records,
            unbounded=self.unbounded)

