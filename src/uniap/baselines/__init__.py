"""Baseline planners on the same cost tables as UniAP (`cost.tables.build_program` + `solve.program.evaluate`).

    megatron-grid  best uniform tp × pp × dp × ZeRO × micro-batch size × recompute (= best `uniap estimate` row)
    galvatron      pipeline split first (even / memory-balanced), then a per-stage DP over strategies
    alpa           DP over stage boundaries, each stage costed by its own intra-op DP (equal stage sizes)
    dp             plain data parallelism (DDP), no pipeline, with or without recomputation
    zero3          fully sharded data parallelism (FSDP), no pipeline, with or without recomputation

Every one returns a `BaselineResult` (method, Plan or None, predicted iteration time = `evaluate` of its
assignment, search time, fits).
"""

from __future__ import annotations

from uniap.baselines.alpa import alpa
from uniap.baselines.common import BaselineResult
from uniap.baselines.galvatron import galvatron
from uniap.baselines.megatron import data_parallel, megatron_grid, zero3
from uniap.errors import UniapError
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.spec.workload import Workload

BASELINES = {
    "megatron-grid": megatron_grid,
    "galvatron": galvatron,
    "alpa": alpa,
    "dp": data_parallel,
    "zero3": zero3,
}

__all__ = ["BASELINES", "BaselineResult", "alpa", "data_parallel", "galvatron", "megatron_grid", "run_baseline",
           "zero3"]


def run_baseline(method: str, model: ModelSpec, cluster: ClusterSpec, workload: Workload, *,
                 schedule: str = "1f1b", max_tp: int | None = None) -> BaselineResult:
    """Run the baseline called `method` (one of BASELINES)."""
    try:
        fn = BASELINES[method]
    except KeyError:
        raise UniapError(f"unknown baseline {method!r} (choose {', '.join(BASELINES)})") from None
    return fn(model, cluster, workload, schedule=schedule, max_tp=max_tp)


from uniap.baselines.comparison import METHODS, compare, parse_methods  # noqa: E402  (needs BASELINES above)

__all__ += ["METHODS", "compare", "parse_methods"]
