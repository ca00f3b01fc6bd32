"""Galvatron (Miao et al., "Galvatron: Efficient Transformer Training over Multiple GPUs Using Automatic
Parallelism", VLDB 2023; memory/time balancing as in Galvatron-BMW, Wang et al. 2023), on our cost tables.

Galvatron decides in two steps, which is the difference from UniAP's one joint optimisation:

1. **Pipeline split first.** For each pipeline degree P (divisors of the device count), the layers are cut into
   P contiguous stages *before* any strategy is chosen: an even split of the blocks (Megatron's), and a
   memory-balanced split (minimise the largest stage memory, each layer counted at its smallest footprint with the
   stage's in-flight micro-batches, as BMW balances memory); a time-balanced split (each layer at its fastest
   strategy) is tried too.
2. **Per-stage dynamic program.** Inside each stage, a DP over the layers picks each layer's strategy
   (dp × tp × {DDP, ZeRO-3 "SDP"} × activation checkpointing: Galvatron's search space — no ZeRO-1/2 and no
   sequence parallelism) to minimise the stage's time under the device memory budget, paying the resharding cost
   between consecutive strategies (see `chain`). The stage time the DP minimises is Galvatron's additive one:
   c · (per-micro-batch compute, communication, resharding) + the once-per-iteration gradient sync.

Over P and the micro-batch count c (divisors of the global batch), the plan with the smallest `evaluate` wins.
Cross-stage sends and the pipeline's bottleneck structure are not optimised by the DP, only scored afterwards.
"""

from __future__ import annotations

import math
import time

import numpy as np

from uniap.baselines.chain import DEFAULT_BINS, ChainDP
from uniap.baselines.common import BaselineResult, Best, finish, programs, stage_strategies
from uniap.errors import UniapError
from uniap.estimate import uniform_split
from uniap.program import StageProgram
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.spec.workload import Workload


def _masked(program: StageProgram, table) -> np.ndarray:
    return np.where(np.asarray(program.allowed), np.asarray(table, dtype=float), math.inf)


def balanced_split(weights: np.ndarray, stages: int) -> np.ndarray | None:
    """Contiguous split of the chain into `stages` non-empty stages minimising the largest stage weight, where
    weights[i, u] is layer u's weight on stage i (stages hold different numbers of micro-batches in flight)."""
    P, L = weights.shape
    if P > L:
        return None
    prefix = np.concatenate([np.zeros((P, 1)), np.cumsum(weights, axis=1)], axis=1)  # (P, L+1)
    # F[i][b] = best max weight of stages 0..i covering layers 0..b-1; cut[i][b] = where stage i starts.
    F = np.full((P, L + 1), math.inf)
    cut = np.zeros((P, L + 1), dtype=int)
    F[0, 1:] = prefix[0, 1:]
    for i in range(1, P):
        for b in range(i + 1, L + 1):
            a = np.arange(i, b)  # stage i holds layers a..b-1
            vals = np.maximum(F[i - 1, a], prefix[i, b] - prefix[i, a])
            j = int(np.argmin(vals))
            F[i, b], cut[i, b] = vals[j], a[j]
    if not math.isfinite(F[P - 1, L]):
        return None
    stage_of = np.zeros(L, dtype=int)
    b = L
    for i in range(P - 1, 0, -1):
        a = cut[i, b]
        stage_of[a:b] = i
        b = a
    return stage_of


def splits(model: ModelSpec, program: StageProgram) -> dict[str, np.ndarray]:
    """The pipeline splits Galvatron tries for one configuration."""
    P = program.stages
    out = {}
    try:
        out["even"] = uniform_split(model, P)
    except UniapError:
        pass
    if P == 1:
        return {"even": np.zeros(program.layers, dtype=int)}
    infl = np.asarray(program.inflight, dtype=float)
    Ms, Ma = _masked(program, program.Ms), _masked(program, program.Ma)
    memory = np.stack([(Ms + f * Ma).min(axis=1) for f in infl])  # (P, L)
    time_ = np.broadcast_to(_masked(program, program.A).min(axis=1), (P, program.layers))
    for name, weights in (("memory-balanced", memory), ("time-balanced", time_)):
        stage_of = balanced_split(weights, P)
        if stage_of is not None and not any(np.array_equal(stage_of, s) for s in out.values()):
            out[name] = stage_of
    return out


def stage_dp(program: StageProgram, stage_of: np.ndarray, bins: int = DEFAULT_BINS) -> np.ndarray | None:
    """Each stage's strategies by the per-stage DP (None if some stage cannot fit)."""
    c = program.micro_batches
    cost = c * _masked(program, program.A) + _masked(program, program.G)
    trans = c * np.asarray(program.R, dtype=float)
    strategy_of = np.zeros(program.layers, dtype=int)
    for i in range(program.stages):
        members = np.flatnonzero(stage_of == i)
        first, last = int(members[0]), int(members[-1])
        mem = _masked(program, program.Ms) + float(program.inflight[i]) * _masked(program, program.Ma)
        dp = ChainDP(cost[first:last + 1], trans[first:last], mem[first:last + 1], program.memory_capacity, bins)
        value, chosen = dp.best(0, last - first)
        if chosen is None:
            return None
        strategy_of[first:last + 1] = chosen
    return strategy_of


def galvatron(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str = "1f1b",
              max_tp: int | None = None, bins: int = DEFAULT_BINS) -> BaselineResult:
    """Galvatron's search: pipeline split first, then a per-stage DP over strategies under the memory budget."""
    start = time.perf_counter()
    best, seen = Best(), 0
    space = lambda p: stage_strategies(cluster, p, max_tp, zero=(0, 3), sequence_parallel=False)  # noqa: E731
    for bound, strategies, program in programs(model, cluster, workload, schedule, space):
        seen += 1
        if bound >= best.value:
            continue
        for name, stage_of in splits(model, program).items():
            strategy_of = stage_dp(program, stage_of, bins)
            if strategy_of is None:
                continue
            best.offer(program, strategies, stage_of, strategy_of,
                       f"pp{program.stages} c{program.micro_batches} {name} split, per-stage DP")
    return finish("galvatron", model, cluster, workload, schedule, best, start, seen)
