"""Runner-up plans: the best plan of every other pipeline configuration, and which of them the chosen plan's
uncertainty interval cannot tell from it (`uniap plan --profile`).

The search (`planner.plan_search`) cuts off every candidate (pipeline degree, micro-batches, chunks) that cannot
beat the best found, so it knows no runner-ups. Here each candidate is solved alone, without that cut-off, and its
best plan is costed and given its own interval. A runner-up whose predicted time falls inside the chosen plan's
interval is a tie: the prediction's uncertainty (the profile's spread, and the model's own error where it was
measured) cannot say which of the two is faster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from uniap.plans import Plan


@dataclass(frozen=True)
class RunnerUp:
    """One other pipeline configuration's best plan against the chosen one."""

    plan: Plan
    """Its best plan (costed, with its interval when the profile has one)."""
    slower: float
    """Its predicted time over the chosen plan's, minus 1 (0.03: 3 % slower)."""
    tie: bool
    """Its predicted time falls inside the chosen plan's interval."""


def runner_ups(model, cluster, workload, chosen: Plan, intervals, *, schedule: str, solver: str = "highs",
               max_tp: int | None = None, max_cp: int | None = None, max_virtual_stages: int = 2,
               time_limit: float = 60.0) -> tuple[list[RunnerUp], bool]:
    """The best plan of each pipeline configuration other than the chosen plan's, fastest first, those inside
    the chosen plan's interval marked as ties; and whether every configuration was solved within `time_limit`
    seconds (False: the list is partial)."""
    from uniap.estimate import make_plan, predict
    from uniap.planner import build_candidate, candidates, stage_strategies
    from uniap.schedules import searched_schedules
    from uniap.solve.uop import search

    cands = candidates(model, cluster, workload, searched_schedules(schedule), max_virtual_stages)
    build = partial(build_candidate, model=model, cluster=cluster, workload=workload, max_tp=max_tp, cache={},
                    max_cp=max_cp)
    mine = (chosen.pipeline.degree, chosen.pipeline.micro_batches, chosen.virtual_stages, chosen.pipeline.schedule)
    point = float(chosen.predicted["iteration_time_s"])
    high = chosen.interval.high_s if chosen.interval is not None else point
    deadline = time.perf_counter() + float(time_limit)
    found, complete = [], True
    for cand in cands:
        if tuple(cand) == mine:
            continue
        left = deadline - time.perf_counter()
        if left <= 0:
            complete = False
            break
        result = search([cand], build, solver=solver, time_limit=left, workers=1)
        if result.solution is None:
            continue
        program, sol = build(cand), result.solution
        predicted = predict(model, cluster, workload, program, sol.stage_of, sol.strategy_of)
        plan = make_plan(model, cluster, workload, cand.schedule, cand.micro_batches,
                         stage_strategies(model, cluster, workload, cand, max_tp, max_cp), sol.stage_of,
                         sol.strategy_of, predicted, None, virtual_stages=cand.virtual_stages)
        plan = intervals.attach(plan) if intervals is not None else plan
        t = float(predicted["iteration_time_s"])
        found.append(RunnerUp(plan, t / point - 1.0, t <= high))
    found.sort(key=lambda r: r.slower)
    return found, complete
