"""`uniap plan`: the unified optimisation process (UOP) over pipeline configurations.

For every pipeline degree P (a divisor of the device count, at most the number of layers), micro-batch
count c (a divisor of the global batch), schedule and — for the interleaved schedules — number of virtual stages
v (every v up to `max_virtual_stages` that leaves a layer per chunk, with c a multiple of P), build the cost
tables and let the MIQP choose stage placement and every layer's strategy together; keep the configuration
with the least time per iteration. Candidates whose lower bound cannot beat the incumbent are skipped
(solve.uop).
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import NamedTuple

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
from uniap.schedules import DEFAULT, schedule_named, searched_schedules
from uniap.spec.workload import Workload
from uniap.strategies import Strategy, context_degrees, divisors, enumerate_strategies

GB = 1e9
MAX_VIRTUAL_STAGES = 8
"""Default most chunks per device group the search tries (Megatron-LM's published runs use 2–6)."""


class Candidate(NamedTuple):
    """One pipeline configuration of the search: its own program, solved on its own."""

    stages: int
    """P: pipeline stages (device groups)."""
    micro_batches: int
    """c: micro-batches per iteration."""
    virtual_stages: int
    """v: chunks per stage (1 but for the interleaved schedules)."""
    schedule: str
    """The pipeline schedule it runs (`uniap.schedules`)."""


def candidates(model: ModelSpec, cluster: ClusterSpec, workload: Workload, schedules: tuple[str, ...] = ("1f1b",),
               max_virtual_stages: int = MAX_VIRTUAL_STAGES) -> list[Candidate]:
    """Every (P, c, v, schedule) of `schedules`: P divides the devices and is at most the layer count; c divides
    the global batch; a plain schedule (GPipe or 1F1B) takes v = 1 and any P; one with several chunks per stage
    takes P ≥ 2, P·v ≤ layers and every v ≤ `max_virtual_stages` its `Schedule.check` accepts (interleaved 1F1B:
    v ≥ 2, c a multiple of P; zero bubble: v ≥ 1, c a multiple of P; the V schedules: v = 2, c ≥ 2P). One stage
    is searched once, as the plain schedule (or as 1F1B where only others are asked for: all are the same there)."""
    layers = len(model.layers)
    stages = [p for p in divisors(cluster.devices) if p <= layers]
    plain = next((s for s in schedules if not schedule_named(s).interleaved), None)
    out = []
    for p in stages:
        for c in divisors(workload.global_batch):
            if plain is not None or p == 1:
                out.append(Candidate(p, c, 1, plain or "1f1b"))
            if p < 2:
                continue
            for name in schedules:
                if schedule_named(name).interleaved:
                    out += [Candidate(p, c, v, name) for v in range(1, max_virtual_stages + 1)
                            if p * v <= layers and _runs(name, p, c, v)]
    return out


def _runs(schedule: str, stages: int, micro_batches: int, virtual_stages: int) -> bool:
    try:
        schedule_named(schedule).check(stages, micro_batches, virtual_stages)
    except UniapError:
        return False
    return True


class BuildCache(dict):
    """The cache `build_candidate` keeps between calls. It travels to the search's worker processes empty, each
    filling its own: by the time the workers start it holds tens of megabytes of tables (19 MB on GPT-OSS 120B
    after 60 candidates), which took 0.3 s per worker to send and as long to read."""

    def __reduce__(self):
        return (BuildCache, ())


def candidate_builder(model: ModelSpec, cluster: ClusterSpec, workload: Workload, max_tp: int | None,
                      max_cp: int | None = None):
    """`build_candidate` for one search: candidate → its program (or None), with a cache of its own."""
    return partial(build_candidate, model=model, cluster=cluster, workload=workload, max_tp=max_tp,
                   cache=BuildCache(), max_cp=max_cp)


def build_candidate(candidate: Candidate, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                    max_tp: int | None, cache: dict | None = None, max_cp: int | None = None) -> StageProgram | None:
    """Tables of one (P, c, v), or None when no strategy can split its micro-batch. `cache`, a dict the caller
    keeps, holds every (P, c)'s strategies and their per-signature costs (kilobytes each: a candidate solved
    after its bound was taken is not priced again) and the tables the last (P, c) priced (megabytes; `candidates`
    lists the v's of one (P, c) in a row)."""
    stages, micro_batches, virtual, schedule = candidate
    columns = None if cache is None else cache.setdefault("strategies", {})
    key = (stages, micro_batches, schedule_named(schedule).split_backward)
    if columns is not None and key in columns:
        strategies, rows = columns[key]
    else:
        strategies, rows = stage_columns(model, cluster, workload, candidate, max_tp, max_cp)
        if columns is not None:
            columns[key] = (strategies, rows)
    if not strategies:
        return None
    program = build_program(model, cluster, workload, stages, micro_batches, strategies, schedule, virtual,
                            None if cache is None else cache.setdefault("tables", {}), rows=rows)
    if not program.allowed.any(axis=1).all():
        return None
    return program


def stage_strategies(model: ModelSpec, cluster: ClusterSpec, workload: Workload, candidate: Candidate,
                     max_tp: int | None, max_cp: int | None = None) -> list[Strategy]:
    """The strategies of a stage of N/P devices the search keeps (`stage_columns`)."""
    return stage_columns(model, cluster, workload, candidate, max_tp, max_cp)[0]


def stage_columns(model: ModelSpec, cluster: ClusterSpec, workload: Workload, candidate: Candidate,
                  max_tp: int | None, max_cp: int | None = None) -> tuple[list[Strategy], tuple | None]:
    """The strategies of a stage of N/P devices that at least one layer can take and that no other strategy of
    the same layout beats on every layer (fewer columns to solve), and their `cost.tables.signature_costs`
    (for build_program, which would price them again otherwise).

    Beaten: another strategy whose activation layout is the same (so every resharding and send costs the same)
    is allowed wherever this one is and no worse in A, G, Ms and Ma on every distinct layer; any plan using
    this one is then matched by swapping it out. A schedule that splits the backward takes ZeRO-0 strategies only,
    priced as it runs them (the gradient all-reduce after the step: `cost.tables.layer_cost`'s `after_step`), and
    compares only strategies that differ in their recompute level alone, as the dominance does not weigh the weight
    pass the program adds. With a measured cost source the tables are adjusted after
    pricing (cost.source), so only the first filter applies, to the strategies the source holds
    (`CostSource.holds`). cp degrees: `context_degrees` of the sequence, up to `max_cp`."""
    stages, micro_batches = candidate[:2]
    d = cluster.devices // stages
    strategies = enumerate_strategies(d, max_tp=max_tp, experts=model.config.experts,
                                      context=tuple(cp for cp in context_degrees(d, workload.seq_len)
                                                    if max_cp is None or cp <= max_cp))
    split = schedule_named(candidate.schedule).split_backward
    if split:
        strategies = [s for s in strategies if s.zero == 0]
    if cluster.costs is not None:
        micro = workload.global_batch // micro_batches
        distinct = list({layer.signature or layer.name: layer for layer in model.layers}.values())
        return [s for s in strategies if cluster.costs.holds(s)
                and any(disallowed(layer, s, micro) is None for layer in distinct)], None
    index, costs, good = signature_costs(model, cluster, workload, stages, micro_batches, strategies,
                                         after_step=split)
    taken = np.flatnonzero(good.any(axis=0))  # some layer can take it
    if not len(taken) or not good.any(axis=1).all():  # none, or a layer that no strategy can run: impossible
        return [], None
    usable, costs, good = [strategies[k] for k in taken], costs[:, taken], good[:, taken]
    values = np.where(good[..., None], costs, np.inf)  # a strategy a layer cannot take costs it infinitely
    rows = values.transpose(1, 0, 2).reshape(len(usable), -1)  # (K, distinct layers × 4)
    classes: dict[tuple, list[int]] = {}
    for k, s in enumerate(usable):  # split backward: only recompute variants compared (same weight pass and sync)
        classes.setdefault((s.layout, s.ep, s.etp) if split else s.layout, []).append(k)
    keep = np.zeros(len(usable), dtype=bool)
    for members in classes.values():  # dominance within one layout: compare a class with itself only
        keep[members] = undominated(np.ones(len(members), dtype=bool), np.zeros(len(members), dtype=int),
                                    list(rows[members].T))
    kept = np.flatnonzero(keep)
    return [usable[k] for k in kept], (index, costs[:, kept], good[:, kept])


def plan_search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, schedule: str = DEFAULT,
                solver: str = "highs", time_limit: float | None = None, max_tp: int | None = None,
                workers: int | None = None, progress=None, max_virtual_stages: int = MAX_VIRTUAL_STAGES,
                max_cp: int | None = None) -> Plan:
    """The best plan over all pipeline configurations, with the search facts the plan contract carries.

    `schedule` names a search (`SEARCHES`): "default" (or "all") searches 1F1B, interleaved 1F1B (v =
    2..max_virtual_stages), zero bubble (v = 1..max_virtual_stages) and the V schedules (ZBV, DualPipeV: v = 2)
    together; "interleaved-1f1b" the first two; any schedule's name that schedule alone. Interleaved 1F1B
    programs are bounded and solved by device group first (solve.group_bound, solve.group_relaxation);
    zero-bubble ones by their device-group contents (solve.split_bound) and whole blocks over a level
    (solve.group_bound), then their chunk MILP."""
    check_time_limit(time_limit)
    schedules = searched_schedules(schedule)
    if solver == "scip" and any(schedule_named(s).interleaved for s in schedules):
        raise UniapError("the SCIP back-end solves plain pipelines only; search interleaving and zero bubble with "
                         "highs or gurobi (or --schedule 1f1b)")
    if max_tp is not None and max_tp < 1:
        raise UniapError(f"--max-tp must be >= 1, got {max_tp}")
    if max_cp is not None and max_cp < 1:
        raise UniapError(f"--max-cp must be >= 1, got {max_cp}")
    if max_virtual_stages < 1:
        raise UniapError(f"--max-virtual-stages must be >= 1, got {max_virtual_stages}")
    started = time.perf_counter()
    cands = candidates(model, cluster, workload, schedules, max_virtual_stages)
    build = candidate_builder(model, cluster, workload, max_tp, max_cp)
    result = search(cands, build, solver=solver, time_limit=time_limit, workers=workers, progress=progress)
    if result.solution is None:
        raise UniapError(_no_plan_message(cands, build, cluster))
    best = result.best
    program = build(best)
    strategies = stage_strategies(model, cluster, workload, best, max_tp, max_cp)
    sol = result.solution
    predicted = predict(model, cluster, workload, program, sol.stage_of, sol.strategy_of)
    search_facts = {"solver": solver, "time_s": time.perf_counter() - started, "optimal": bool(result.optimal),
                    "gap": float(result.gap), "candidates": len(cands), "unbounded": result.unbounded}
    return make_plan(model, cluster, workload, best.schedule, best.micro_batches, strategies,
                     sol.stage_of, sol.strategy_of, predicted, search_facts, virtual_stages=best.virtual_stages)


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
        if schedule_named(cand.schedule).interleaved:
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
