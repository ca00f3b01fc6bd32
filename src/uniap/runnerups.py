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
from dataclasses import dataclass, replace

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
               time_limit: float = 60.0) -> tuple[Plan, list[RunnerUp], bool]:
    """The chosen plan; the best plan of each other pipeline configuration, fastest first, those inside the
    chosen plan's interval marked as ties; and whether every configuration was solved within `time_limit`
    seconds (False: the list is partial).

    Where ranks share cores, a plan is priced by its own stage times (`estimate.as_planned`) and the search by
    balanced ones (and a search that ran out of time returns its best so far), so a runner-up can come out faster
    than the plan the search returned: it is then the chosen plan (with the search's facts, not proven optimal,
    `search_ranked_first` naming the search's plan), and the search's plan a runner-up. Not under an engine's
    rules: the runner-ups are the free search's."""
    from uniap.estimate import make_plan, predict
    from uniap.planner import candidate_builder, candidates, stage_strategies
    from uniap.schedules import searched_schedules
    from uniap.solve.uop import search
    from uniap.views import describe

    cands = candidates(model, cluster, workload, searched_schedules(schedule), max_virtual_stages)
    build = candidate_builder(model, cluster, workload, max_tp, max_cp)
    mine = (chosen.pipeline.degree, chosen.pipeline.micro_batches, chosen.virtual_stages, chosen.pipeline.schedule)
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
        found.append(intervals.attach(plan) if intervals is not None else plan)
    fastest = min(found, key=_time, default=chosen)
    if _time(fastest) < _time(chosen) and not (chosen.search or {}).get("engine"):  # the list is not the engine's
        found[found.index(fastest)] = chosen
        chosen = replace(fastest, search=dict(chosen.search or {}, search_ranked_first=describe(chosen),
                                              optimal=False, gap=None))
    point = _time(chosen)
    high = chosen.interval.high_s if chosen.interval is not None else point
    others = [RunnerUp(plan, _time(plan) / point - 1.0, _time(plan) <= high) for plan in found]
    return chosen, sorted(others, key=lambda r: r.slower), complete


def _time(plan: Plan) -> float:
    return float(plan.predicted["iteration_time_s"])
