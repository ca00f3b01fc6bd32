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
import functools
import math
import multiprocessing
import os
import pickle
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from uniap.children import die_with_parent
from uniap.solve import backends
from uniap.solve.guesses import stagewise_guess, uniform_guess
from uniap.solve.milp import Outcome, solve_outcome
from uniap.program import StageProgram, distinct_rows
from uniap.solve.program import Solution, lower_bound

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
"""Seconds of bounding done in this process before worker processes may take the rest; then seconds of the
whole search before waiting MILP steps may start them (`_milps_waiting`), and of solving before the solves'
median may (`_worth_workers`)."""
WORKER_START_S = 0.5
"""What starting the worker pool costs here: about 0.3 s until both workers answer (spawned processes importing
uniap and unpickling the model), and the CPU their imports take from this process."""
TRIAL_S = 2.0
"""Seconds a plain candidate's first MILP may run. One that is not settled by then goes back in the queue after
every candidate of its tier (keeping the plan it found, if any, as the incumbent) and is solved again with the
incumbent they leave, which usually cuts it at once: a weak-bound MILP that would take a minute to prove it
loses (DeepSeek-V3's pp32 with 480 micro-batches on 2,048 H800: 46 s) no longer waits for the one that wins."""


def search(candidates: Sequence[Hashable], build: Callable[[Hashable], StageProgram | None], *,
           solver: str = "highs", time_limit: float | None = None, workers: int | None = None,
           progress: Callable[[int, int, float], None] | None = None) -> SearchResult:
    """Solve every candidate's program (build(candidate); None means impossible) and return the best.

    `time_limit` bounds the whole search (seconds): each solve gets what is left, candidates not started by then
    are recorded as "timeout". `workers` > 1 solves in that many processes (default min(cpu count, 2)).
    `progress(done, total, best_objective)` is called after each candidate is settled. `build` runs once to bound
    a candidate and again to solve it (programs are megabytes each: they are rebuilt rather than all held at
    once), here or, when it can be pickled, in the worker processes, so it should be deterministic.

    Candidates are solved best-first, in the order of their bounds, plain and interleaved alike: an interleaved
    candidate's first steps (its group bound, then its device-group MILPs) are cheap and come back with a
    stronger bound (`PHASES`), so a winner that interleaves settles early and skips the plain candidates it beats
    (solving plain candidates first cost GPT-1T on 3,072 A100 1.8 s of its 9.9 s). Only the long steps wait in a
    later tier: a trial the limit stopped and a chunk MILP.
    """
    started = time.perf_counter()
    deadline = None if time_limit is None else started + float(time_limit)
    workers = min(os.cpu_count() or 1, 2) if workers is None else max(1, int(workers))
    with _Workers(workers, build) as pool:
        return _search(candidates, build, solver, deadline, workers, progress, pool, started)


def _search(candidates, build, solver: str, deadline: float | None, workers: int, progress,
            pool: "_Workers", started: float) -> SearchResult:
    """`search`'s body, with the worker processes (started when first needed) that both its phases share."""
    records: dict[int, CandidateRecord] = {}
    queue: list[tuple[int, float, int]] = []  # (tier, lower bound, candidate index)
    guess: tuple[int, Solution] | None = None
    unbounded: list[int] = []  # not even built before the deadline (a plan was in hand already)
    unguessed: set[int] = set()  # bounded without a uniform plan
    for index, found in _bounds(candidates, build, workers, deadline, pool):
        if found is None:
            unbounded.append(index)
            continue
        status, bound, uniform = found
        if status != "bounded":
            records[index] = CandidateRecord(candidates[index], math.inf, None, status, 0.0)
            continue
        queue.append((0, bound, index))
        if uniform is None:
            unguessed.add(index)
        elif guess is None or uniform.objective < guess[1].objective:
            guess = (index, uniform)
    queue.sort()
    for _, bound, index in [entry for entry in queue if entry[2] in unguessed][:LATE_GUESSES]:
        if guess is None or bound < guess[1].objective:
            uniform = uniform_guess(build(candidates[index]))
            if uniform is not None and (guess is None or uniform.objective < guess[1].objective):
                guess = (index, uniform)
    guess = _stagewise_incumbent(queue, unguessed, candidates, build, guess)
    state = _State(candidates, records, progress)
    state.unbounded = len(unbounded)
    for index in unbounded:  # nothing is known of them: their floor is 0, so the gap says so
        records[index] = CandidateRecord(candidates[index], 0.0, None, "timeout", 0.0)
        state.floors[index] = 0.0
    if guess is not None:  # an incumbent before any MILP: solves then only look for something better
        state.best_index, state.best = guess
    state.report_settled()
    # Serially first: most searches settle in a few solves, and starting worker processes costs WORKER_START_S.
    # A search that has run SERIAL_BUDGET_S is not one of those: what is left goes to the workers as soon as two
    # MILP steps wait, or, after SERIAL_BUDGET_S of solving, as soon as the solves' median says it is worth it.
    solving = time.perf_counter()
    solve_times: list[float] = []
    build_times: list[float] = []  # this process builds every program, for the workers too
    while queue:
        now = time.perf_counter()
        if workers > 1 and now >= started + SERIAL_BUDGET_S and (
                _milps_waiting(queue, state) or
                (now >= solving + SERIAL_BUDGET_S and _worth_workers(queue, state, solve_times, build_times, workers))):
            break
        tier_of, bound, index = queue.pop(0)
        if state.skip(index, bound, deadline):
            continue
        build_started = time.perf_counter()
        program = build(candidates[index])
        solve_started = time.perf_counter()
        build_times.append(solve_started - build_started)
        trial = state.trial(index, program)
        outcome = solve_outcome(program, solver=solver, time_limit=_time_limit(_left(deadline), trial),
                                cutoff=state.cutoff(), phase=state.phase(index), known=bound)
        seconds = time.perf_counter() - solve_started
        solve_times.append(seconds)
        entry = (tier_of, bound, index)
        if not (state.retry(queue, entry, outcome, seconds, trial, deadline)
                or state.defer(queue, entry, outcome, seconds)):
            state.settle(index, bound, outcome, seconds + state.deferred.get(index, 0.0))
    if queue:
        _parallel(queue, build, state, solver, deadline, pool)
    ordered = [records[i] for i in range(len(candidates))]
    return state.result(ordered, time.perf_counter() - started)


LATE_GUESSES = 8
"""Candidates bounded without a uniform plan (interleaved ones, or beaten when bounded) that get one once every
bound is known, least bound first: the incumbent then comes from the most promising. Pricing every interleaved
candidate's cost GPT-1T's search on 3,072 A100 0.7 s; none at all cost Llama 3 405B's on 16,384 H100 2 s."""
PARALLEL_BOUNDS_S = 4.0
"""Seconds of building and bounding still to do (at the rate of the first second) from which the rest is handed
to worker processes, a share each: DeepSeek-V3 on 2,048 H800 has 1,044 candidates whose pricing alone took 28 s in
one process. The pool starts in about 0.3 s here (spawned processes importing uniap and unpickling the model),
but each worker then prices its share without this process's cache, so a search with less to do, or with less
time left before its deadline than that, bounds them all here."""


STAGEWISE_GUESSES = 8
"""Plain and zero-bubble candidates, least bound first, whose stagewise plans (solve.guesses) are priced before any
MILP where the chain does not fold (`_stagewise_incumbent`)."""


def _stagewise_incumbent(queue, unguessed: set[int], candidates, build, guess):
    """The incumbent to start from: `guess`, or the best stagewise plan of the STAGEWISE_GUESSES most promising
    plain and zero-bubble candidates (those with a uniform plan) if better, on a chain of which at least half the
    layers are runs of their own. There each MILP places every layer apart and HiGHS finds plans slowly, and the
    candidate solved first otherwise runs against the uniform plan: on GPT-OSS 120B (batch 1,280) a pp8
    zero-bubble MILP that cannot beat another's stagewise plan ran out the 120 s limit before that one was
    reached. On chains that fold (llama2-70b) a better early incumbent changed which solves ran in the workers
    and cost 0.4–0.5 s of 1.8 s, so they keep the uniform one (each MILP is still cut off at its own stagewise
    plan: solve.milp)."""
    promising = [entry for entry in queue if entry[2] not in unguessed][:STAGEWISE_GUESSES]
    for rank, (_, bound, index) in enumerate(promising):
        if guess is not None and bound >= guess[1].objective:
            break
        program = build(candidates[index])
        if rank == 0 and len(distinct_rows(program.group)[0]) < program.layers / 2:
            break  # the chain folds (it is the same for every candidate)
        stagewise = stagewise_guess(program)
        if stagewise is not None and (guess is None or stagewise.objective < guess[1].objective):
            guess = (index, stagewise)
    return guess


class _Workers:
    """The search's worker processes, started at the first `get` and shared by the bounding and the solving
    phases (starting them costs WORKER_START_S or more: once per search, not once per phase). Each holds the
    search's `build` when it can be sent (its own cache then serves the candidates it gets)."""

    def __init__(self, workers: int, build):
        self.workers, self.build, self.pool = workers, build, None

    @functools.cached_property
    def remote(self) -> bool:
        """Whether `build` can be sent to the workers (pickled once: it carries the whole model)."""
        return _picklable(self.build)

    def get(self) -> ProcessPoolExecutor:
        if self.pool is None:
            context = multiprocessing.get_context("spawn")  # no fork of a process that may hold solver threads
            self.pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context, initializer=_start_worker,
                                            initargs=(self.build if self.remote else None,))
        return self.pool

    def __enter__(self) -> "_Workers":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _bounds(candidates: Sequence[Hashable], build, workers: int, deadline: float | None,
            pool: _Workers) -> list:
    """(index, (status, lower bound, uniform plan) or None when left unbuilt by the deadline) of every
    candidate, in order: status "bounded", "impossible" (build gave None) or "infeasible" (bound inf). Here for
    SERIAL_BUDGET_S, then in worker processes if what is left would take PARALLEL_BOUNDS_S more and `build` can be
    sent to them."""
    started = time.perf_counter()
    items = list(enumerate(candidates))
    done: list = []
    while workers > 1 and items and time.perf_counter() - started < SERIAL_BUDGET_S:
        done += _bound_share(items[:1], build, _left(deadline), _best_uniform(done))
        items = items[1:]
    rate = (time.perf_counter() - started) / max(len(done), 1)
    left = _left(deadline)
    if items and rate * len(items) >= PARALLEL_BOUNDS_S and (left is None or left >= PARALLEL_BOUNDS_S) \
            and pool.remote:
        # Contiguous blocks, dealt out in turn: a builder that caches what consecutive candidates share (the
        # planner prices a (P, c) once for all of its v's) keeps most of that, and the shares stay even.
        size = max(1, len(items) // (8 * workers))
        blocks = [items[lo:lo + size] for lo in range(0, len(items), size)]
        shares = [[item for block in blocks[w::workers] for item in block] for w in range(workers)]
        parts = [pool.get().submit(_bound_share, share, None, left, _best_uniform(done)) for share in shares]
        done += [pair for part in parts for pair in part.result()]
    else:
        done += _bound_share(items, build, left, _best_uniform(done))
    return sorted(done, key=lambda pair: pair[0])


def _best_uniform(done: list) -> float:
    """The best uniform plan's TPI among bounded candidates (inf when none)."""
    return min((found[2].objective for _, found in done if found is not None and found[2] is not None),
               default=math.inf)


def _bound_share(items: list, build, left: float | None, best: float = math.inf) -> list:
    """`_bounds` of some (index, candidate) items, in one process (`build` None: the worker's); `left` seconds
    until the search's deadline. A candidate whose bound cannot beat the best uniform plan found so far (`best`
    to begin with) needs no uniform plan of its own."""
    build = _WORKER_BUILD if build is None else build
    deadline = None if left is None else time.perf_counter() + left
    out = []
    for index, candidate in items:
        if deadline is not None and best < math.inf and time.perf_counter() >= deadline:
            out.append((index, None))
            continue
        program = build(candidate)
        if program is None:
            out.append((index, ("impossible", math.inf, None)))
            continue
        program.validate()
        bound = lower_bound(program)
        if bound == math.inf:
            out.append((index, ("infeasible", math.inf, None)))
            continue
        # Interleaved uniform plans cost several times a plain one's to price: only the most promising get one
        # (LATE_GUESSES, once every bound is known).
        uniform = uniform_guess(program) if bound < best and program.virtual_stages == 1 else None
        if uniform is not None:
            best = min(best, uniform.objective)
        out.append((index, ("bounded", bound, uniform)))
    return out


def _picklable(*objects) -> bool:
    try:
        pickle.dumps(objects)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def _milps_waiting(queue, state: "_State") -> bool:
    """Whether two or more of the candidates left that can still beat the incumbent wait for a MILP step (`PHASES`
    after the bound, or a trial retried). Their times are heavy-tailed (0.05 s to 13 s on Nemotron-4 340B's
    searches, with nothing to tell which beforehand) and the pool starts in about 0.3 s, so workers pay."""
    cutoff = state.cutoff()
    return sum(index in state.deferred for _, bound, index in queue if cutoff is None or bound < cutoff) >= 2


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


def _parallel(queue, build, state: "_State", solver: str, deadline: float | None, workers: _Workers) -> None:
    """Keep one solve per worker in flight, each cut off at the incumbent of the moment it starts. A candidate of a
    higher tier waits until every solve of a lower tier has settled, so it starts with their incumbent. A deferred
    one starts beside the solves in flight: they may yet skip it, but its core would idle otherwise (until 8
    December it waited for them, and on Nemotron-4 340B on 128 H100 a 7 s device-group and chunk MILP then
    followed the winner's 13 s chunk MILP instead of running beside it: 22 s, now 16 s). Each worker builds the
    programs it solves when `build` can be sent to it (its own cache then serves the candidates it gets; programs
    are megabytes to send); otherwise this process builds them."""
    pending = list(queue)
    pool = workers.get()
    remote = workers.remote
    running: dict[Future, tuple[int, float, float, int]] = {}
    while pending or running:
        while pending and len(running) < workers.workers:
            if running and pending[0][0] > max(entry[3] for entry in running.values()):
                break  # the next tier waits for the incumbent of this one
            tier, bound, index = pending.pop(0)
            if state.skip(index, bound, deadline):
                continue
            work = state.candidates[index] if remote else build(state.candidates[index])
            future = pool.submit(_solve_in_worker, work, index in state.tried, solver, _left(deadline),
                                 state.cutoff(), state.phase(index), bound)
            running[future] = (index, bound, time.perf_counter(), tier)
        if not running:
            continue
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            index, bound, submitted, tier = running.pop(future)
            seconds = time.perf_counter() - submitted
            outcome, trial = future.result()
            entry = (tier, bound, index)
            if not (state.retry(pending, entry, outcome, seconds, trial, deadline)
                    or state.defer(pending, entry, outcome, seconds)):
                state.settle(index, bound, outcome, seconds + state.deferred.get(index, 0.0))


_WORKER_BUILD = None
"""The `build` of the search a worker process serves (set when the pool starts it)."""


def _start_worker(build) -> None:
    global _WORKER_BUILD
    die_with_parent()  # a signal that ends the search ends its workers too
    backends.limit_threads(1)
    _WORKER_BUILD = build


def _solve_in_worker(work, tried: bool, solver: str, left: float | None, cutoff: float | None,
                     phase: str, known: float) -> tuple[Outcome, bool]:
    """Solve one candidate (`work`: the candidate, built here, or its program; `known`: its bound in the queue)
    in a worker: (outcome, whether it was a trial, `_State.trial`'s rule)."""
    program = _WORKER_BUILD(work) if _WORKER_BUILD is not None else work
    trial = _is_trial(program, tried)
    return solve_outcome(program, solver=solver, time_limit=_time_limit(left, trial), cutoff=cutoff,
                         phase=phase, known=known), trial


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.perf_counter(), 0.0)


def _is_trial(program: StageProgram, tried: bool) -> bool:
    """Whether a solve is a plain or zero-bubble candidate's first MILP (`tried`: one ran already), cut short at
    TRIAL_S (interleaved 1F1B candidates are solved in PHASES instead)."""
    return (program.virtual_stages == 1 or program.split_schedule is not None) and not tried


def _time_limit(left: float | None, trial: bool) -> float | None:
    """A solve's time limit: what is left of the search (`left` seconds, None: no limit), at most TRIAL_S for a
    trial."""
    return left if not trial else TRIAL_S if left is None else min(TRIAL_S, left)


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
        self.tried: set[int] = set()  # plain candidates whose first MILP ran (under TRIAL_S)

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

    def trial(self, index: int, program: StageProgram) -> bool:
        return _is_trial(program, index in self.tried)

    def retry(self, queue: list, entry: tuple[int, float, int], outcome: Outcome, seconds: float, trial: bool,
              deadline: float | None) -> bool:
        """Send a trial the limit stopped back to the queue, after its tier: the plan it found (if any) becomes
        the incumbent when it is better, and its bound is what the solver proved. Not when the search's own time
        is up (then the limit was the search's, and the candidate is settled as it stands)."""
        if not trial:
            return False
        self.tried.add(entry[2])
        if outcome.status not in ("feasible", "timeout") or (deadline is not None and time.perf_counter() >= deadline):
            return False
        tier, bound, index = entry
        sol = outcome.solution
        if sol is not None:
            bound = max(bound, sol.objective * (1.0 - sol.gap))
            if self.best is None or sol.objective < self.best.objective:
                self.best_index, self.best = index, sol
        self.deferred[index] = self.deferred.get(index, 0.0) + seconds
        bisect.insort(queue, (tier + 1, bound, index))
        return True

    def defer(self, queue: list, entry: tuple[int, float, int], outcome: Outcome, seconds: float) -> bool:
        """Put a deferred candidate back in the queue, in order, with the bound it now has: it is solved further
        after the candidates that may beat it, or skipped if one does. A plan its step built on the way (not
        proven optimal) becomes the incumbent when it is better.

        A chunk MILP keeps its tier, in bound order with every other step. Until 7 December it went after the whole
        tier's cheaper steps, for a better cut-off; on Nemotron-4 340B on 128 H100 (fp8) that ran a 5 s device-group
        step whose bound (3.506 s) the waiting chunk MILP's optimum (3.499 s) beat, and the published table took
        528 s where it takes 506 s in bound order (the targets the same or faster)."""
        if outcome.status != "deferred":
            return False
        tier, bound, index = entry
        sol = outcome.solution
        if sol is not None and (self.best is None or sol.objective < self.best.objective):
            self.best_index, self.best = index, sol
        self.deferred[index] = self.deferred.get(index, 0.0) + seconds
        self.deferrals[index] = PHASES.index(outcome.phase) + 1  # its next solve takes the step after it
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

