"""`uniap plan --engine E`: the fastest plan an engine can run, beside the free optimum.

An engine runs one strategy over all blocks (`export.capability`), so the search is: every pipeline
configuration (P, c, v) the planner would try whose schedule the engine has, times every engine assignment
(`engine_rows`: one strategy on the MoE blocks, or on every block of a dense model, that strategy without the
experts' layout on dense blocks and without recompute on embedding and head) the engine can run
(`EngineRules.strategy_why_not`, its expert layouts included), times the splits it can express:
- "any" (torchtitan's module lists per chunk): the MILP places the stages with every layer's strategy pinned, so
  the best split is proven like the planner's;
- "first-last" (Megatron-LM) and "even" (DeepSpeed): few enough splits to cost each one with `evaluate`.
Each (P, c, v) is skipped when its lower bound cannot beat the best plan found, which changes nothing but the time.
The restricted space is inside the free one, so the restricted plan is never faster than the free optimum.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from uniap.errors import UniapError
from uniap.estimate import make_plan, predict
from uniap.export.capability import ANY_SPLIT, EVEN, EngineRules
from uniap.plans import Plan
from uniap.planner import MAX_VIRTUAL_STAGES, build_candidate, candidates, plan_search, stage_strategies
from uniap.program import StageProgram
from uniap.schedules import DEFAULT, searched_schedules
from uniap.solve.program import evaluate_many, lower_bound
from uniap.solve.uop import search
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import LayerSpec, ModelSpec
from uniap.spec.workload import Workload
from uniap.strategies import Strategy


@dataclass(frozen=True)
class EngineSearch:
    """The engine-restricted plan and the free optimum it is measured against."""

    plan: Plan
    """The fastest plan the engine can run (its `search` section says which engine)."""
    free: Plan
    """The unrestricted optimum of the same search space."""

    @property
    def slowdown(self) -> float:
        """How much longer an iteration of the engine's plan takes: restricted / free − 1."""
        return float(self.plan.search["slowdown"])


def engine_splits(rules: EngineRules, blocks: int, pp: int, v: int) -> list[tuple[int, ...]]:
    """Every block count per chunk the engine can express on pp stages of v chunks ("any" is left to the MILP)."""
    if rules.split == EVEN:
        return [(blocks // pp,) * pp] if v == 1 and blocks % pp == 0 else []
    if pp == 1:
        return [(blocks,)] if v == 1 else []
    per_stage = []  # (first, middle, last) block counts per stage, each a multiple of v and at least v
    for first in range(v, blocks + 1, v):
        for last in range(v, blocks - first + 1, v):
            rest, middle_stages = blocks - first - last, pp - 2
            if middle_stages == 0:
                if rest == 0:
                    per_stage.append([first, last])
            elif rest % middle_stages == 0 and rest // middle_stages >= v and (rest // middle_stages) % v == 0:
                per_stage.append([first] + [rest // middle_stages] * middle_stages + [last])
    return [tuple(stages[j % pp] // v for j in range(pp * v)) for stages in per_stage]


def engine_rows(layers: list[LayerSpec], strategies: list[Strategy], allowed: np.ndarray, rules: EngineRules,
                pp: int, seq_len: int | None = None) -> np.ndarray:
    """(assignments, layers): for every strategy s the engine can give the MoE blocks (every block of a dense model)
    on pp stages, the assignment it configures: s on MoE blocks, s without ep and etp on dense blocks, that without
    recompute on embedding and head; kept where `allowed` (layers × strategies) lets every layer take its part and
    the engine can split sequences of `seq_len` tokens as s needs (torchtitan: a multiple of tp·2·cp)."""
    index = {s: k for k, s in enumerate(strategies)}
    experts = max((layer.experts for layer in layers), default=0)
    kinds = ["moe" if layer.experts else "block" if layer.kind == "block" else "edge" for layer in layers]
    rows = []
    for s in strategies:
        if rules.strategy_why_not(s, pp, experts, seq_len):
            continue
        dense = replace(s, ep=1, etp=1)
        parts = {"moe": s, "block": dense, "edge": replace(dense, recompute="none")}
        if any(parts[kind] not in index for kind in kinds):
            continue
        row = np.array([index[parts[kind]] for kind in kinds])
        if np.asarray(allowed)[np.arange(len(layers)), row].all():
            rows.append(row)
    return np.array(rows, dtype=int).reshape(len(rows), len(layers))


def chunk_of_layers(chunk_blocks: tuple[int, ...]) -> np.ndarray:
    """Each layer's chunk for a decoder chain: embedding on chunk 0, the blocks in order, head on the last."""
    chunks = [j for j, count in enumerate(chunk_blocks) for _ in range(count)]
    return np.array([0] + chunks + [len(chunk_blocks) - 1])


def pinned(program: StageProgram, row: np.ndarray) -> tuple[StageProgram, np.ndarray]:
    """`program` with every layer u held to strategy row[u]: the columns row uses, each allowed only where row
    puts it. Returns the program and the original column of each of its columns."""
    columns = np.unique(row)
    allowed = row[:, None] == columns[None, :]
    grid = np.ix_(np.arange(program.layers - 1), columns, columns)
    return replace(program, A=program.A[:, columns], G=program.G[:, columns], Ms=program.Ms[:, columns],
                   Ma=program.Ma[:, columns], R=program.R[grid], Rp=program.Rp[grid],
                   allowed=allowed & np.asarray(program.allowed)[:, columns],
                   weight_gradient=None if program.weight_gradient is None else program.weight_gradient[:, columns]
                   ), columns


def split_bounds(program: StageProgram, stage_of: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(splits, rows) lower bounds on `evaluate`: the TPI formula with only the layers' own times (A, G), no
    re-layout or send times and no memory check, all of which can only add."""
    layers = np.arange(program.layers)
    A, G = np.asarray(program.A)[layers, rows], np.asarray(program.G)[layers, rows]  # (rows, L)
    device = np.asarray(stage_of) % program.pipeline_degree  # (splits, L)
    onehot = device[:, :, None] == np.arange(program.pipeline_degree)[None, None, :]  # (splits, L, P)
    busy = np.einsum("slp,nl->snp", onehot, A).max(axis=2)
    sync = np.einsum("slp,nl->snp", onehot, G).max(axis=2)
    v = program.virtual_stages
    return A.sum(axis=1)[None, :] / v + (program.micro_batches - 1 / v) * busy + sync


def engine_plan_search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, rules: EngineRules, *,
                       schedule: str = DEFAULT, solver: str = "highs", time_limit: float | None = None,
                       max_tp: int | None = None, workers: int | None = None,
                       max_virtual_stages: int = MAX_VIRTUAL_STAGES) -> EngineSearch:
    """The engine-restricted optimum and the free optimum (both searched over the same schedules)."""
    why = rules.why_not_model(model.config, workload.precision)
    if why:
        raise UniapError(f"{rules.name} cannot run {model.name}: {why}")
    kinds = [layer.kind for layer in model.layers]
    if len(kinds) < 3 or kinds[0] != "embedding" or kinds[-1] != "head" or set(kinds[1:-1]) != {"block"}:
        raise UniapError(f"--engine plans decoder-only models (embedding, blocks, head); {model.name} is not one")
    blocks = len(kinds) - 2
    free = plan_search(model, cluster, workload, schedule=schedule, solver=solver, time_limit=time_limit,
                       max_tp=max_tp, workers=workers, max_virtual_stages=max_virtual_stages)
    started = time.perf_counter()
    pipelines = rules.pipeline_why_not is None or rules.pipeline_why_not(model.config) is None
    cands = [cand for cand in candidates(model, cluster, workload, searched_schedules(schedule), max_virtual_stages)
             if cand.stages == 1 or (pipelines and cand.schedule in rules.pipeline_schedules)]

    @lru_cache(maxsize=4)  # programs are megabytes each: rebuilt rather than all held (as the planner does)
    def tables(cand):
        program = build_candidate(cand, model, cluster, workload, max_tp)
        if program is None:
            return None
        strategies = stage_strategies(model, cluster, workload, cand, max_tp)
        return program, strategies, engine_rows(model.layers, strategies, program.allowed, rules, cand[0],
                                                   workload.seq_len)

    best = (math.inf, None, None, None)  # value, candidate, stage_of, strategy_of
    optimal, gap = True, 0.0
    if rules.split == ANY_SPLIT:
        pins = [(cand, i) for cand in cands if tables(cand) is not None for i in range(len(tables(cand)[2]))]

        def build(pin):
            program, _, rows = tables(pin[0])
            return pinned(program, rows[pin[1]])[0]

        left = None if time_limit is None else max(0.0, time_limit - (time.perf_counter() - started))
        result = search(pins, build, solver=solver, time_limit=left, workers=workers)
        if result.solution is not None:
            cand, i = result.best
            program, _, rows = tables(cand)
            columns = pinned(program, rows[i])[1]
            best = (result.solution.objective, cand, result.solution.stage_of, columns[result.solution.strategy_of])
        optimal, gap = bool(result.optimal), float(result.gap)
    else:
        bounds_first = sorted((lower_bound(built[0]), cand) for cand in cands
                              if (built := tables(cand)) is not None and len(built[2]))
        for bound, cand in bounds_first:
            if bound >= best[0]:
                continue
            program, _, rows = tables(cand)
            splits = engine_splits(rules, blocks, cand[0], cand[2])
            if not splits:
                continue
            stage_of = np.array([chunk_of_layers(chunks) for chunks in splits])
            bounds = split_bounds(program, stage_of, rows)
            for s in np.argsort(bounds.min(axis=1)):
                promising = bounds[s] < best[0]
                if not promising.any():
                    break  # the splits left are sorted by their least bound: none can win
                values = evaluate_many(program, stage_of[s], rows[promising])
                i = int(np.argmin(values))
                if values[i] < best[0]:
                    best = (float(values[i]), cand, stage_of[s], rows[promising][i])
    _, cand, stage_of, strategy_of = best
    if cand is None:
        raise UniapError(f"no plan {rules.name} can run fits: {free.model.name} on {cluster.name} needs a "
                         "strategy or split the engine does not have (see `uniap plan` without --engine)")
    program, strategies, _ = tables(cand)
    predicted = predict(model, cluster, workload, program, stage_of, strategy_of)
    facts = {"solver": solver if rules.split == ANY_SPLIT else "enumeration", "time_s": time.perf_counter() - started,
             "optimal": optimal, "gap": gap, "candidates": len(cands), "engine": rules.name,
             "free_iteration_time_s": free.predicted["iteration_time_s"],
             "slowdown": predicted["iteration_time_s"] / free.predicted["iteration_time_s"] - 1.0}
    plan = make_plan(model, cluster, workload, cand.schedule, cand.micro_batches, strategies, stage_of,
                     strategy_of, predicted, facts, virtual_stages=cand.virtual_stages)
    return EngineSearch(plan=plan, free=free)
