"""The baseline planners by name, and running one (what `compare` and the CLI pick from)."""

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


def run_baseline(method: str, model: ModelSpec, cluster: ClusterSpec, workload: Workload, *,
                 schedule: str = "1f1b", max_tp: int | None = None) -> BaselineResult:
    """Run the baseline called `method` (one of BASELINES)."""
    try:
        fn = BASELINES[method]
    except KeyError:
        raise UniapError(f"unknown baseline {method!r} (choose {', '.join(BASELINES)})") from None
    return fn(model, cluster, workload, schedule=schedule, max_tp=max_tp)
