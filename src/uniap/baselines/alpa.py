"""Alpa (Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed Deep Learning",
OSDI 2022), on our cost tables.

Alpa is hierarchical: an *inter-operator* pass slices the chain into pipeline stages by dynamic programming, and
the cost of every candidate stage comes from a separate *intra-operator* pass that picks each operator's sharding
for that stage alone. What we keep, and where we depart:

* **Intra-op pass.** For every contiguous range of layers [a, b] and every stage position (which fixes how many
  micro-batches are in flight, hence the memory), the cheapest strategy per layer under the memory budget, with
  resharding costs between consecutive layers. Alpa solves an ILP over the operator graph; on our chain of layers
  the same problem is solved exactly by a DP (`chain.ChainDP`, memory discretised and rounded up). The stage
  latency it minimises is the per-micro-batch time plus the stage's once-per-iteration work spread over the
  c micro-batches (Alpa compiles the gradient update into the stage; we amortise it).
* **Inter-op pass.** Alpa's DP over stage boundaries minimising Σ t_i + (c − 1) · max t_i, by enumerating the
  bottleneck t_max in increasing order, solving min Σ t_i with every t_i ≤ t_max, and stopping as soon as
  c · t_max cannot beat the best found (Alpa §5.2).
* **Departures.** (1) Alpa also chooses each stage's device mesh (submesh shapes of different sizes); our cost
  tables give every stage N/P devices, so the DP runs over contiguous stage boundaries with equal stage sizes and
  is repeated for each pipeline degree P. (2) The micro-batch count is an input to Alpa; we repeat the search for
  every divisor of the global batch. (3) Cross-stage send costs are ignored by both passes (as in Alpa's DP) and
  only appear when the final plan is scored. (4) The best (P, c) is picked by `evaluate`, the shared objective.
"""

from __future__ import annotations

import math
import time

import numpy as np

from uniap.baselines.chain import ChainDP
from uniap.baselines.common import BaselineResult, Best, finish, programs, stage_strategies
from uniap.program import StageProgram
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.spec.workload import Workload

ALPA_BINS = 512
"""Memory steps of the intra-op DP: it runs for every range of layers at once, so it gets fewer than Galvatron's
single-range DP (one step is capacity/512, ≈ 0.2%)."""


def inter_op(t: np.ndarray, micro_batches: int) -> tuple[float, np.ndarray | None]:
    """Alpa's inter-operator DP. t[i, a, b]: latency of layers a..b as stage i (inf if impossible).

    Returns (Σ t_i + (c − 1) max t_i, stage of each layer) of the best contiguous split into P non-empty stages,
    or (inf, None)."""
    P, L, _ = t.shape
    c = micro_batches
    best, best_cuts = math.inf, None
    finite = t[np.isfinite(t)]
    for t_max in np.unique(finite):
        if c * t_max >= best:
            break
        tm = np.where(t <= t_max, t, math.inf)
        F = tm[0, 0, :].copy()  # F[b]: stages 0..i covering layers 0..b
        args = []
        for i in range(1, P):
            prev = np.concatenate([[math.inf], F[:-1]])  # stage i starts at a: stages before cover 0..a-1
            total = prev[:, None] + tm[i]  # (a, b)
            arg = np.argmin(total, axis=0)
            F = total[arg, np.arange(L)]
            args.append(arg)
        if not math.isfinite(F[L - 1]):
            continue
        # Recover the cut points and score the split with its true bottleneck (≤ t_max).
        starts, b = [], L - 1
        for i in range(P - 1, 0, -1):
            a = int(args[i - 1][b])
            starts.append(a)
            b = a - 1
        starts = [0] + starts[::-1]
        ends = starts[1:] + [L]
        lat = [t[i, a, e - 1] for i, (a, e) in enumerate(zip(starts, ends))]
        value = float(sum(lat) + (c - 1) * max(lat))
        if value < best:
            best, best_cuts = value, starts
    if best_cuts is None:
        return math.inf, None
    stage_of = np.zeros(L, dtype=int)
    for a in best_cuts[1:]:
        stage_of[a:] += 1
    return best, stage_of


def _masked(program: StageProgram, table) -> np.ndarray:
    return np.where(np.asarray(program.allowed), np.asarray(table, dtype=float), math.inf)


def alpa_program(program: StageProgram, bins: int = ALPA_BINS) -> tuple[np.ndarray, np.ndarray] | None:
    """(stage_of, strategy_of) Alpa's two passes give for one configuration (None if nothing fits)."""
    P, L, c = program.stages, program.layers, program.micro_batches
    cost = _masked(program, program.A) + _masked(program, program.G) / c
    trans = np.asarray(program.R, dtype=float)
    Ms, Ma = _masked(program, program.Ms), _masked(program, program.Ma)
    dps: dict[float, ChainDP] = {}

    def dp_for(i: int) -> ChainDP:
        f = float(program.inflight[i])
        if f not in dps:
            dps[f] = ChainDP(cost, trans, Ms + f * Ma, program.memory_capacity, bins)
        return dps[f]

    if P == 1:
        stage_of = np.zeros(L, dtype=int)
    else:
        infl = [float(f) for f in program.inflight]
        t = np.full((P, L, L), math.inf)
        for f in dict.fromkeys(infl):
            # stage i starts at a ≥ i and ends at b ≤ L − P + i (every stage holds at least one layer)
            stages = [i for i in range(P) if infl[i] == f]
            lo, hi = min(stages), max(stages)
            table = dp_for(lo).range_costs(first_min=lo, first_max=L - P + hi if hi else 0, last_max=L - P + hi)
            for i in stages:
                t[i] = table
        value, stage_of = inter_op(t, c)
        if stage_of is None:
            return None
    strategy_of = np.zeros(L, dtype=int)
    for i in range(P):
        members = np.flatnonzero(stage_of == i)
        _, chosen = dp_for(i).best(int(members[0]), int(members[-1]))
        if chosen is None:
            return None
        strategy_of[members] = chosen
    return stage_of, strategy_of


def alpa(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str = "1f1b",
         max_tp: int | None = None, bins: int = ALPA_BINS) -> BaselineResult:
    """Alpa's inter-op DP over stage boundaries, each stage costed by its own intra-op pass."""
    start = time.perf_counter()
    best, seen = Best(), 0
    space = lambda p: stage_strategies(cluster, p, max_tp)  # noqa: E731  Alpa's sharding space covers ZeRO and SP
    for bound, strategies, program in programs(model, cluster, workload, schedule, space):
        seen += 1
        if bound >= best.value:
            continue
        found = alpa_program(program, bins)
        if found is None:
            continue
        best.offer(program, strategies, found[0], found[1],
                   f"pp{program.stages} c{program.micro_batches} inter-op DP, intra-op DP per stage")
    return finish("alpa", model, cluster, workload, schedule, best, start, seen)
