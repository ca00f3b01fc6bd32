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
from uniap.baselines.comparison import METHODS, compare, parse_methods
from uniap.baselines.galvatron import galvatron
from uniap.baselines.megatron import data_parallel, megatron_grid, zero3
from uniap.baselines.registry import BASELINES, run_baseline

__all__ = ["BASELINES", "METHODS", "BaselineResult", "alpa", "compare", "data_parallel", "galvatron", "megatron_grid",
           "parse_methods", "run_baseline", "zero3"]
