"""What every baseline shares: the candidate pipeline configurations, the result record, and turning an
assignment into a Plan.

A baseline only *chooses* (stage, strategy) per layer. Its predicted iteration time is always
`solve.program.evaluate` of that choice on the tables of `cost.tables.build_program`, as the plan runs them
(`estimate.as_planned`) — never a private formula — so a baseline and `uniap` are compared on exactly the same
costs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from uniap.cost.tables import build_program
from uniap.errors import UniapError
from uniap.estimate import as_planned, make_plan, predict
from uniap.plans import Plan
from uniap.program import StageProgram
from uniap.solve.program import evaluate, lower_bound
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.schedules import schedule_named
from uniap.spec.workload import Workload
from uniap.strategies import RECOMPUTE_LEVELS, Strategy, divisors, enumerate_strategies


@dataclass
class BaselineResult:
    """One method's answer: its plan (None if nothing it can express fits), the plan's predicted iteration time
    (`evaluate` of its assignment; None when nothing fits), the wall-clock search time, whether it fits, and a
    one-line description of the configuration it chose."""

    method: str
    plan: Plan | None
    iteration_time_s: float | None
    search_time_s: float
    fits: bool
    config: str = ""
    candidates: int = 0  # pipeline configurations (P, c) looked at

    @property
    def throughput_samples_per_s(self) -> float | None:
        if self.plan is None or self.iteration_time_s is None:
            return None
        return int(self.plan.workload.global_batch) / self.iteration_time_s


@dataclass
class Best:
    """The best assignment a search has met so far (by `evaluate`)."""

    value: float = math.inf
    program: StageProgram | None = None
    strategies: list[Strategy] = field(default_factory=list)
    stage_of: np.ndarray | None = None
    strategy_of: np.ndarray | None = None
    config: str = ""

    def offer(self, program: StageProgram, strategies: list[Strategy], stage_of, strategy_of, config: str = "",
              value: float | None = None) -> float:
        """Score an assignment with `evaluate` (the one objective) and keep it if it is the best so far."""
        stage_of = np.asarray(stage_of, dtype=int)
        strategy_of = np.asarray(strategy_of, dtype=int)
        if value is None:
            value = evaluate(program, stage_of, strategy_of)
        if value < self.value:
            self.value, self.program, self.strategies = value, program, strategies
            self.stage_of, self.strategy_of, self.config = stage_of, strategy_of, config
        return value


def pipeline_degrees(cluster: ClusterSpec, layers: int) -> list[int]:
    """P: divisors of the device count, at most one stage per layer."""
    return [p for p in divisors(cluster.devices) if p <= layers]


def micro_batch_counts(workload: Workload) -> list[int]:
    """c: divisors of the global batch (whether a micro-batch splits over dp is each strategy's business)."""
    return divisors(workload.global_batch)


def stage_strategies(cluster: ClusterSpec, stages: int, max_tp: int | None = None, *, zero=(0, 1, 2, 3),
                     recompute=RECOMPUTE_LEVELS, sequence_parallel: bool = True, tp=None,
                     experts: int = 0) -> list[Strategy]:
    """The strategies of a stage of N/P devices (enumerate_strategies), narrowed to a baseline's search space;
    `experts` > 0 adds the expert layouts (a baseline that has expert parallelism, as Megatron-LM)."""
    out = []
    for s in enumerate_strategies(cluster.devices // stages, max_tp=max_tp, sequence_parallel=sequence_parallel,
                                  experts=experts):
        if s.recompute not in recompute or (tp is not None and s.tp not in tp):
            continue
        if s.dp > 1 and s.zero not in zero:
            continue
        out.append(s)
    return out


def programs(model: ModelSpec, cluster: ClusterSpec, workload: Workload, schedule: str, strategies_of_stage,
             degrees=None, counts=None) -> Iterator[tuple[float, list[Strategy], StageProgram]]:
    """(lower bound, strategies, tables) of every candidate pipeline configuration (P, c), smallest lower bound
    first, skipping those where some layer has no allowed strategy or the bound proves nothing fits.

    `strategies_of_stage(P)` gives a baseline's strategy set for stages of N/P devices. Callers skip a candidate
    whose bound is no better than their best plan: that never changes what they return, only how fast.
    Tables are rebuilt when yielded (a few ms) rather than all held at once.
    """
    schedule_named(schedule)
    degrees = pipeline_degrees(cluster, len(model.layers)) if degrees is None else degrees
    counts = micro_batch_counts(workload) if counts is None else counts
    found = []
    for p in degrees:
        strategies = strategies_of_stage(p)
        if not strategies:
            continue
        for c in counts:
            program = build_program(model, cluster, workload, p, c, strategies, schedule)
            if not np.asarray(program.allowed).any(axis=1).all():
                continue
            bound = lower_bound(program)
            if math.isfinite(bound):
                found.append((bound, p, c))
    found.sort()
    for bound, p, c in found:
        strategies = strategies_of_stage(p)
        yield bound, strategies, build_program(model, cluster, workload, p, c, strategies, schedule)


def finish(method: str, model: ModelSpec, cluster: ClusterSpec, workload: Workload, schedule: str, best: Best,
           start: float, candidates: int) -> BaselineResult:
    """The result record (with a Plan when something fits) of a finished search started at `start`."""
    elapsed = time.perf_counter() - start
    if best.program is None or not math.isfinite(best.value):
        return BaselineResult(method, None, None, elapsed, False, "nothing fits", candidates)
    program = best.program
    value = evaluate(as_planned(program, cluster, best.stage_of, best.strategy_of), best.stage_of, best.strategy_of)
    if not math.isfinite(value):  # cannot happen: `offer` only keeps finite values
        raise UniapError(f"{method}: internal error, chosen plan is infeasible")
    # Keep only the strategies used, in a stable order, so the plan file lists what runs.
    used = sorted({int(k) for k in best.strategy_of})
    strategies = [best.strategies[k] for k in used]
    remap = {k: i for i, k in enumerate(used)}
    strategy_of = np.array([remap[int(k)] for k in best.strategy_of], dtype=int)
    predicted = predict(model, cluster, workload, program, best.stage_of, best.strategy_of)
    search = {"solver": method, "time_s": elapsed, "optimal": False, "gap": None, "candidates": candidates,
              "baseline": True}
    plan = make_plan(model, cluster, workload, schedule, program.micro_batches, strategies, best.stage_of,
                     strategy_of, predicted, search)
    return BaselineResult(method, plan, value, elapsed, True, best.config, candidates)
