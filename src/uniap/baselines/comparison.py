"""UniAP side by side with the baselines, every method scored by the same `evaluate` on the same cost tables (as
each plan runs them, `estimate.as_planned`)."""

from __future__ import annotations

import math
import time

from uniap.baselines.registry import BASELINES, run_baseline
from uniap.errors import UniapError
from uniap.plans import Plan
from uniap.solve.program import evaluate
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.schedules import schedule_named
from uniap.spec.workload import Workload

UNIAP = "uniap"
METHODS = (UNIAP, *BASELINES)
ALIASES = {"megatron": "megatron-grid", "ddp": "dp", "fsdp": "zero3"}


def parse_methods(methods) -> list[str]:
    """None → all methods; else names (a list, comma-separated strings, or both), deduplicated in order."""
    if methods is None:
        return list(METHODS)
    if isinstance(methods, str):
        methods = [methods]
    out = []
    for item in methods:
        for name in str(item).split(","):
            name = ALIASES.get(name.strip().lower(), name.strip().lower())
            if not name:
                continue
            if name not in METHODS:
                raise UniapError(f"unknown method {name!r} (choose from {', '.join(METHODS)})")
            if name not in out:
                out.append(name)
    if not out:
        raise UniapError(f"no method given (choose from {', '.join(METHODS)})")
    return out


def recost(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> float:
    """A plan's iteration time by `evaluate` on freshly built tables, as the plan runs them (math.inf if it does
    not fit)."""
    from uniap.estimate import as_planned, cost_plan

    program, stage_of, strategy_of = cost_plan(plan, model, cluster)
    return evaluate(as_planned(program, cluster, stage_of, strategy_of), stage_of, strategy_of)


def run_uniap(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str, solver: str,
              time_limit: float | None, max_tp: int | None = None) -> dict:
    """UniAP's row: `planner.plan_search`, its plan re-costed by `evaluate` like every baseline's."""
    try:
        from uniap.planner import check_time_limit, plan_search
    except ImportError as exc:
        raise UniapError(f"the UniAP planner is not available ({exc})") from None
    try:
        from uniap.solve.milp import SOLVERS
    except ImportError:
        SOLVERS = None
    if SOLVERS is not None and solver not in SOLVERS:  # bad input is an error, not a row that "does not fit"
        raise UniapError(f"unknown solver {solver!r} (choose {', '.join(SOLVERS)})")
    check_time_limit(time_limit)
    start = time.perf_counter()
    plan, error = None, None
    try:
        plan = plan_search(model, cluster, workload, schedule=schedule, solver=solver, time_limit=time_limit,
                           max_tp=max_tp)
    except UniapError as exc:  # e.g. nothing fits: a row that says so, not a failed comparison
        error = str(exc)
    elapsed = time.perf_counter() - start
    value = recost(plan, model, cluster) if plan is not None else math.inf
    search = (plan.search or {}) if plan is not None else {}
    config = ""
    if plan is not None:
        config = f"pp{plan.pipeline.degree} c{plan.pipeline.micro_batches} MIQP"
        if search.get("optimal"):
            config += " (optimal)"
        elif search.get("gap") is not None:
            config += f" (gap {float(search['gap']) * 100:.2f}%)"
    row = _row(UNIAP, value, elapsed, workload, config)
    if error:
        row["error"] = error
    row["plan"] = plan
    return row


def _row(method: str, value: float | None, search_time: float, workload: Workload, config: str) -> dict:
    fits = value is not None and math.isfinite(value)
    return {"method": method, "iteration_time_s": float(value) if fits else None,
            "throughput_samples_per_s": workload.global_batch / value if fits else None,
            "speedup_of_uniap": None, "search_time_s": float(search_time), "fits": bool(fits), "config": config}


def compare(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, methods=None, schedule: str = "1f1b",
            solver: str = "highs", time_limit: float | None = None, max_tp: int | None = None,
            keep_plans: bool = False) -> dict:
    """One row per method: predicted iteration time and throughput (None when nothing fits), the speed-up of
    UniAP over it (its time / UniAP's), search time and whether it fits. `keep_plans` adds each row's Plan
    under "plan" (not JSON)."""
    names = parse_methods(methods)
    schedule_named(schedule)
    rows = []
    for name in names:
        if name == UNIAP:
            row = run_uniap(model, cluster, workload, schedule=schedule, solver=solver, time_limit=time_limit,
                            max_tp=max_tp)
        else:
            result = run_baseline(name, model, cluster, workload, schedule=schedule, max_tp=max_tp)
            row = _row(name, result.iteration_time_s, result.search_time_s, workload, result.config)
            row["plan"] = result.plan
        rows.append(row)
    ours = next((r for r in rows if r["method"] == UNIAP and r["fits"]), None)
    for row in rows:
        if ours is not None and row["fits"]:
            row["speedup_of_uniap"] = row["iteration_time_s"] / ours["iteration_time_s"]
        if not keep_plans:
            row.pop("plan", None)
    return {"model": model.name, "cluster": cluster.name, "workload": workload.to_json(), "schedule": schedule,
            "rows": rows}
