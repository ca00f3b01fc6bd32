"""`uniap plan`: the unified optimisation process (UOP) over pipeline configurations.

For every pipeline degree P (a divisor of the device count, at most the number of layers), micro-batch
count c (a divisor of the global batch) and — for the interleaved 1F1B schedule — number of virtual stages v
(every v ≥ 2 up to `max_virtual_stages` that leaves a layer per chunk, with c a multiple of P), build the cost
tables and let the MIQP choose stage placement and every layer's strategy together; keep the configuration
with the least time per iteration. Candidates whose lower bound cannot beat the incumbent are skipped
(solve.uop).
"""

from __future__ import annotations

import math
import time
from functools import partial

import numpy as np

from uniap.cost.tables import build_program, disallowed, signature_costs
from uniap.errors import UniapError
from uniap.estimate import make_plan, predict
from uniap.plans import Plan
from uniap.program import StageProgram
from uniap.solve.reduce import undominated
from uniap.solve.uop import search
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.schedules import INTERLEAVED, schedule_named
from uniap.spec.workload import Workload
from uniap.strategies import Strategy, context_degrees, divisors, enumerate_strategies

GB = 1e9
MAX_VIRTUAL_STAGES = 8
"""Default most chunks per device group the search tries (Megatron-LM's published runs use 2–6)."""
PLAIN = ("gpipe", "1f1b")


def candidates(model: ModelSpec, cluster: ClusterSpec, workload: Workload, schedules: tuple[str, ...] = ("1f1b",),
               max_virtual_stages: int = MAX_VIRTUAL_STAGES) -> list[tuple[int, int, int]]:
    """(P, c, v): P divides the devices and is at most the layer count; c divides the global batch; v = 1 for
    a plain schedule, and 2..max_virtual_stages with P·v ≤ layers, P ≥ 2 and c a multiple of P for interleaving."""
    layers = len(model.layers)
    stages = [p for p in divisors(cluster.devices) if p <= layers]
    out = []
    for p in stages:
        for c in divisors(workload.global_batch):
            out.append((p, c, 1))  # the plain schedule, always searched
            if INTERLEAVED in schedules and p >= 2 and c % p == 0:
                out += [(p, c, v) for v in range(2, max_virtual_stages + 1) if p * v <= layers]
    return out


def schedule_of(candidate: tuple[int, int, int], schedules: tuple[str, ...]) -> str:
    """The schedule a candidate runs: interleaved with v > 1, else the plain one asked for."""
    return INTERLEAVED if candidate[2] > 1 else next(s for s in schedules if s in PLAIN)


def build_candidate(candidate: tuple[int, int, int], model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                    schedules: tuple[str, ...], max_tp: int | None, cache: dict | None = None,
                    max_cp: int | None = None) -> StageProgram | None:
    """Tables of one (P, c, v), or None when no strategy can split its micro-batch. `cache`, a dict the caller
    keeps, holds every (P, c)'s strategies and their per-signature costs (kilobytes each: a candidate solved
    after its bound was taken is not priced again) and the tables the last (P, c) priced (megabytes; `candidates`
    lists the v's of one (P, c) in a row)."""
    stages, micro_batches, virtual = candidate
    columns = None if cache is None else cache.setdefault("strategies", {})
    if columns is not None and (stages, micro_batches) in columns:
        strategies, rows = columns[stages, micro_batches]
    else:
        strategies, rows = stage_columns(model, cluster, workload, candidate, max_tp, max_cp)
        if columns is not None:
            columns[stages, micro_batches] = (strategies, rows)
    if not strategies:
        return None
    program = build_program(model, cluster, workload, stages, micro_batches, strategies,
                            schedule_of(candidate, schedules), virtual,
                            None if cache is None else cache.setdefault("tables", {}), rows=rows)
    if not program.allowed.any(axis=1).all():
        return None
    return program


def stage_strategies(model: ModelSpec, cluster: ClusterSpec, workload: Workload, candidate: tuple[int, int, int],
                     max_tp: int | None, max_cp: int | None = None) -> list[Strategy]:
    """The strategies of a stage of N/P devices the search keeps (`stage_columns`)."""
    return stage_columns(model, cluster, workload, candidate, max_tp, max_cp)[0]


def stage_columns(model: ModelSpec, cluster: ClusterSpec, workload: Workload, candidate: tuple[int, int, int],
                  max_tp: int | None, max_cp: int | None = None) -> tuple[list[Strategy], tuple | None]:
    """The strategies of a stage of N/P devices that at least one layer can take and that no other strategy of
    the same layout beats on every layer (fewer columns to solve), and their `cost.tables.signature_costs`
    (for build_program, which would price them again otherwise).

    Beaten: another strategy whose activation layout is the same (so every resharding and send costs the same)
    is allowed wherever this one is and no worse in A, G, Ms and Ma on every distinct layer; any plan using
    this one is then matched by swapping it out. With a measured cost source the tables are adjusted after
    pricing (cost.source), so only the first filter applies, to the strategies the source holds
    (`CostSource.holds`). cp degrees: `context_degrees` of the sequence, up to `max_cp`."""
    stages, micro_batches = candidate[:2]
    d = cluster.devices // stages
    strategies = enumerate_strategies(d, max_tp=max_tp, experts=model.config.experts,
                                      context=tuple(cp for cp in context_degrees(d, workload.seq_len)
                                                    if max_cp is None or cp <= max_cp))
    if cluster.costs is not None:
        micro = workload.global_batch // micro_batches
        distinct = list({layer.signature or layer.name: layer for layer in model.layers}.values())
        return [s for s in strategies if cluster.costs.holds(s)
                and any(disallowed(layer, s, micro) is None for layer in distinct)], None
    index, costs, good = signature_costs(model, cluster, workload, stages, micro_batches, strategies)
    taken = np.flatnonzero(good.any(axis=0))  # some layer can take it
    if not len(taken) or not good.any(axis=1).all():  # none, or a layer that no strategy can run: impossible
        return [], None
    usable, costs, good = [strategies[k] for k in taken], costs[:, taken], good[:, taken]
    values = np.where(good[..., None], costs, np.inf)  # a strategy a layer cannot take costs it infinitely
    rows = values.transpose(1, 0, 2).reshape(len(usable), -1)  # (K, distinct layers × 4)
    classes: dict[tuple, list[int]] = {}
    for k, s in enumerate(usable):
        classes.setdefault(s.layout, []).append(k)
    keep = np.zeros(len(usable), dtype=bool)
    for members in classes.values():  # dominance within one layout: compare a class with itself only
        keep[members] = undominated(np.ones(len(members), dtype=bool), np.zeros(len(members), dtype=int),
                                    list(rows[members].T))
    kept = np.flatnonzero(keep)
    return [usable[k] for k in kept], (index, costs[:, kept], good[:, kept])


def plan_search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str = INTERLEAVED,
                solver: str = "highs", time_limit: float | None = None, max_tp: int | None = None,
                workers: int | None = None, progress=None, max_virtual_stages: int = MAX_VIRTUAL_STAGES,
                max_cp: int | None = None) -> Plan:
    """The best plan over all pipeline configurations, with the search facts the plan contract carries.

    `schedule` "interleaved-1f1b" (the default) searches 1F1B and interleaved 1F1B (v = 2..max_virtual_stages;
    none when that is 1) together; "1f1b" and "gpipe" search that schedule alone. Interleaved programs are bounded and
    solved by device group first (solve.group_bound, solve.group_relaxation): llama2-70b's default search takes
    about twice its 1F1B search, GPT-1T's less than its 1F1B search (the interleaved winner cuts the rest off)."""
    if schedule_named(schedule).split_backward:
        raise UniapError(f"the {schedule} schedule is not searched yet (its time is priced by simulation, which the "
                         f"MILP does not encode): price a layout with `uniap estimate --schedule {schedule}`, "
                         f"or search interleaved-1f1b")
    check_time_limit(time_limit)
    schedules = ("1f1b", INTERLEAVED) if schedule == INTERLEAVED else (schedule,)
    if schedule == INTERLEAVED and solver == "scip":
        raise UniapError("the SCIP back-end solves plain pipelines only; search interleaving with highs or gurobi")
    if max_tp is not None and max_tp < 1:
        raise UniapError(f"--max-tp must be >= 1, got {max_tp}")
    if max_cp is not None and max_cp < 1:
        raise UniapError(f"--max-cp must be >= 1, got {max_cp}")
    if max_virtual_stages < 1:
        raise UniapError(f"--max-virtual-stages must be >= 1, got {max_virtual_stages}")
    started = time.perf_counter()
    cands = candidates(model, cluster, workload, schedules, max_virtual_stages)
    build = partial(build_candidate, model=model, cluster=cluster, workload=workload, schedules=schedules,
                    max_tp=max_tp, cache={}, max_cp=max_cp)
    result = search(cands, build, solver=solver, time_limit=time_limit, workers=workers, progress=progress)
    if result.solution is None:
        raise UniapError(_no_plan_message(cands, build, cluster))
    stages, micro_batches, virtual = result.best
    program = build(result.best)
    strategies = stage_strategies(model, cluster, workload, result.best, max_tp, max_cp)
    sol = result.solution
    predicted = predict(model, cluster, workload, program, sol.stage_of, sol.strategy_of)
    search_facts = {"solver": solver, "time_s": time.perf_counter() - started, "optimal": bool(result.optimal),
                    "gap": float(result.gap), "candidates": len(cands), "unbounded": result.unbounded}
    return make_plan(model, cluster, workload, schedule_of(result.best, schedules), micro_batches, strategies,
                     sol.stage_of, sol.strategy_of, predicted, search_facts, virtual_stages=virtual)


def check_time_limit(time_limit: float | None) -> None:
    """Refuse a search time limit that is not positive (None: no limit), in one line; the commands that search
    after other work (`compare`, `demo`) call it first."""
    if time_limit is not None and not time_limit > 0:
        raise UniapError(f"the time limit must be a positive number of seconds, got {time_limit}")


def _no_plan_message(cands, build, cluster: ClusterSpec) -> str:
    """Name the smallest device memory that would hold some plan (exact for the memory rows alone) of a plain
    schedule: an interleaved one holds the same layers per device group and more micro-batches in flight, and
    `min_peak_memory` partitions stages, not chunks that share a device group."""
    need = math.inf
    for cand in cands:
        if cand[2] > 1:
            continue
        program = build(cand)
        if program is not None:
            need = min(need, min_peak_memory(program))
    if need == math.inf:
        return f"no pipeline configuration can split the global batch over {cluster.devices} devices"
    total = need + cluster.device.reserve_bytes
    return (f"no plan fits in {cluster.device.memory_bytes / GB:.1f} GB per device: the leanest plan needs "
            f"{total / GB:.1f} GB per device (use devices with at least that much memory, or more devices)")


def min_peak_memory(program: StageProgram) -> float:
    """Least possible max-over-stages memory: each layer takes its leanest allowed strategy for its stage
    (memory is separable per layer), and a min-max contiguous partition DP places the stage boundaries."""
    L, P = program.layers, program.stages
    big = np.where(program.allowed, 0.0, np.inf)
    # m[i, u]: leanest bytes of layer u if it sits on stage i (stage i holds inflight[i] micro-batches)
    m = np.stack([np.min(program.Ms + program.inflight[i] * program.Ma + big, axis=1) for i in range(P)])
    prefix = np.concatenate([np.zeros((P, 1)), np.cumsum(m, axis=1)], axis=1)
    best = np.full(L + 1, np.inf)  # best[j]: min over partitions of layers [0, j) into stages 0..i
    best[1:] = prefix[0, 1:]
    for i in range(1, P):
        nxt = np.full(L + 1, np.inf)
        for j in range(i + 1, L + 1):
            splits = np.arange(i, j)  # stage i holds layers [split, j)
            nxt[j] = np.min(np.maximum(best[splits], prefix[i, j] - prefix[i, splits]))
        best = nxt
    return float(best[L])
