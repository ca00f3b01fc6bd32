"""Uniform configurations: what Megatron-LM users (and `uniap estimate`) write by hand.

`megatron-grid` tries every uniform configuration — tp × pp × dp × ZeRO stage × micro-batch size ×
recomputation (× Megatron's sequence parallelism when tp > 1) — with Megatron's even split of the blocks
(`estimate.uniform_split`, embedding on the first stage, head on the last) and one strategy for every layer
(`estimate.uniform_assignment`'s rule: layers that cannot be recomputed run the same strategy without it).
Each configuration's time is `evaluate` on the same tables `uniap estimate` builds, so the row of the chosen
configuration equals `uniap estimate` of it. Megatron's micro-batch size is per device: b = B / (c · dp).

`dp` (DDP: ZeRO 0, tp 1, no pipeline) and `zero3` (FSDP: fully sharded, tp 1, no pipeline) are the same
search narrowed to one layout; both try with and without recomputation (and gradient accumulation over
micro-batches) and keep the better.
"""

from __future__ import annotations

import time

import numpy as np

from uniap.baselines.common import BaselineResult, Best, finish, programs, stage_strategies
from uniap.errors import UniapError
from uniap.estimate import uniform_split
from uniap.program import StageProgram
from uniap.solve.program import evaluate_many
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.spec.workload import Workload
from uniap.strategies import Strategy, uniform_fallbacks


def uniform_rows(program: StageProgram, strategies: list[Strategy]) -> tuple[np.ndarray, np.ndarray]:
    """(configurations, assignments): for every strategy k, the uniform assignment (k everywhere; on a layer that
    cannot take it, its first usable `uniform_fallbacks` twin), as `uniform_assignment` makes it; k is left out
    when some layer has no usable twin."""
    ok = np.asarray(program.allowed)
    index = {s: k for k, s in enumerate(strategies)}
    keys, rows = [], []
    for k, s in enumerate(strategies):
        twins = [index[t] for t in uniform_fallbacks(s) if t in index]
        row = np.full(program.layers, -1, dtype=int)
        for j in reversed(twins):  # the most preferred usable twin wins
            row[ok[:, j]] = j
        if (row < 0).any():
            continue
        keys.append(k)
        rows.append(row)
    return np.array(keys, dtype=int), np.array(rows, dtype=int).reshape(len(rows), program.layers)


def describe(s: Strategy, stages: int, micro_batches: int, global_batch: int) -> str:
    micro = global_batch // micro_batches
    parts = [f"pp{stages}", f"tp{s.tp}" + ("·sp" if s.sp else ""), f"dp{s.dp}"]
    if s.dp > 1:
        parts.append(f"zero{s.zero}")
    parts += [f"mbs{micro // s.dp}", f"c{micro_batches}"]
    if s.ep > 1 or s.etp > 1:
        parts.append(f"ep{s.ep}" + (f"·etp{s.etp}" if s.etp > 1 else ""))
    if s.recompute != "none":
        parts.append("recompute" if s.full else "selective recompute")
    return " ".join(parts)


def search_uniform(method: str, model: ModelSpec, cluster: ClusterSpec, workload: Workload, schedule: str,
                   strategies_of_stage, degrees=None) -> BaselineResult:
    start = time.perf_counter()
    best, seen = Best(), 0
    for bound, strategies, program in programs(model, cluster, workload, schedule, strategies_of_stage, degrees):
        seen += 1
        if bound >= best.value:
            continue
        try:
            stage_of = uniform_split(model, program.stages)
        except UniapError:  # more stages than blocks: Megatron cannot split so
            continue
        keys, rows = uniform_rows(program, strategies)
        if not len(keys):
            continue
        values = evaluate_many(program, stage_of, rows)
        i = int(np.argmin(values))
        if values[i] < best.value:
            config = describe(strategies[keys[i]], program.stages, program.micro_batches, workload.global_batch)
            best.offer(program, strategies, stage_of, rows[i], config, value=float(values[i]))
    return finish(method, model, cluster, workload, schedule, best, start, seen)


def megatron_grid(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str = "1f1b",
                  max_tp: int | None = None) -> BaselineResult:
    """The best uniform tp × pp × dp × ZeRO × micro-batch size × recompute configuration (× ep for an MoE model,
    its expert layout on the MoE blocks, as Megatron-LM's --expert-model-parallel-size)."""
    return search_uniform("megatron-grid", model, cluster, workload, schedule,
                          lambda p: stage_strategies(cluster, p, max_tp, experts=model.config.experts))


def data_parallel(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str = "1f1b",
                  max_tp: int | None = None) -> BaselineResult:
    """Plain data parallelism (DDP, ZeRO 0) over all devices, no pipeline, with or without recomputation."""
    return search_uniform("dp", model, cluster, workload, schedule,
                          lambda p: stage_strategies(cluster, p, zero=(0,), tp=(1,)), degrees=[1])


def zero3(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str = "1f1b",
          max_tp: int | None = None) -> BaselineResult:
    """Fully sharded data parallelism (ZeRO-3 / FSDP) over all devices, no pipeline, with or without
    recomputation."""
    return search_uniform("zero3", model, cluster, workload, schedule,
                          lambda p: stage_strategies(cluster, p, zero=(3,), tp=(1,)), degrees=[1])
