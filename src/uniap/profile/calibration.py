"""Calibrated costs: a cluster whose cost tables come from a measured profile.

    cluster = calibrate(load_cluster("cpu:1x4"), "profile.json", model=model, workload=workload)
    plan_search(model, cluster, workload)      # every cost table now uses the measured figures

`calibrate` returns a ClusterSpec whose `costs` is a MeasuredCosts over the measured document and whose DeviceType carries
figures fitted to it (FLOP rate, per-layer overhead, one α–β link). `cost.tables` asks that source (a cost.source.CostSource) first:

  layer (A, G, Ms, Ma)  measured record of (layer signature, strategy) → A = a + b·samples (forward +
                        backward with the layer's tp collectives and, ZeRO 1-3, its per-micro-batch dp
                        gradient reduce-scatter, as measured), G = the optimizer step plus, ZeRO-0, the
                        measured all-reduce of the layer's fp32 gradients once per iteration (the runtime's
                        flat all-reduce, counted serial: gloo's runs on the cores the backward uses),
                        Ms = measured static bytes,
                        Ma = measured saved-activation bytes (a + b·samples). Not in the profile (another
                        layer, a strategy the runtime cannot run): None → the analytic model with the fitted
                        device figures.
  resharding (R)        what the runtime does (runtime.relayout): an all-gather of the source blocks over
                        the stage when the source is split over dp, and of the gradient blocks when the
                        destination is; measured all-gather fit for the stage size.
  stage boundary (Rp)   every rank sends its local block of the activation to the same position of the next
                        stage and receives the gradient back (runtime.pipeline): 2 × measured p2p, plus the
                        re-layout into the next stage's first layer.
  per configuration     (`adjust_tables`, for each pipeline degree P, micro-batch count c and v chunks per
                        stage) what a real step
                        adds to the per-layer figures: on shared CPU cores, less contention when a pipeline keeps fewer ranks busy
                        than the profile did; the pipeline machinery's per-slot cost; GPipe for 1F1B with c < P.

Torch-free (planning needs no torch).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from uniap.schedules import FORWARD_SHARE, chunks_per_stage, schedule_named, simulate_shared
from uniap.errors import UniapError
from uniap.profile.fit import Line
from uniap.profile.schema import load_profile, signature_id, validate
from uniap.spec.cluster import ClusterSpec, Link
from uniap.spec.model import ModelConfig, architecture_id
from uniap.strategies import Strategy


def calibrate(cluster: ClusterSpec, profile, model=None, workload=None) -> ClusterSpec:
    """`cluster` with the measured figures of `profile` (a path or a loaded document).

    Refuses (UniapError, one line) a profile measured on another world size or device kind, and — when
    given — for another model (architecture or sequence length) or precision. The model is compared by the
    architecture id of the config the profile records, not by the fingerprint it wrote: a profile written when
    the id hashed every config field matches as well as a new one.
    """
    doc = profile if isinstance(profile, dict) else load_profile(profile)
    if isinstance(profile, dict):
        validate(doc)
    where = f"profile {profile}" if not isinstance(profile, dict) else "profile"
    world = int(doc["world_size"])
    if world != cluster.devices:
        raise UniapError(f"{where} was measured on {world} ranks but cluster {cluster.name} has {cluster.devices} "
                         f"devices")
    kind = doc.get("device", {}).get("kind")
    if kind and kind != cluster.device.kind:
        raise UniapError(f"{where} was measured on {kind} devices but cluster {cluster.name} is {cluster.device.kind}")
    if model is not None:
        try:
            measured = architecture_id(ModelConfig(**doc["model"]["config"]), int(doc["model"]["seq_len"]))
        except TypeError as exc:  # a field this version does not know
            raise UniapError(f"{where} records a model config this uniap cannot read: {exc}") from None
        if measured != architecture_id(model.config, model.seq_len):
            raise UniapError(f"{where} was measured for model {doc['model'].get('name')!r} at seq_len "
                             f"{doc['model']['seq_len']}, not {model.name!r} at seq_len {model.seq_len} "
                             f"(run `uniap profile` for this model)")
    if workload is not None and workload.precision != doc["precision"]:
        raise UniapError(f"{where} was measured in {doc['precision']}; plan with --precision {doc['precision']}")
    device = cluster.device
    fitted = doc["fitted"]
    rate = fitted["device"].get("flops_per_s")
    precision = doc["precision"]
    if rate:
        peaks = dict(device.peak_flops)
        peak = peaks.get(precision, 0.0)
        if rate > peak:
            peaks[precision] = peak = float(rate)
        device = replace(device, peak_flops=peaks, gemm_efficiency=float(rate) / peak,
                         layer_overhead_s=float(fitted["device"].get("layer_overhead_s") or device.layer_overhead_s))
    link = fitted["link"]
    if link.get("latency_s") is not None:
        measured = Link(latency_s=float(link["latency_s"]),
                        bandwidth=float(link["bandwidth"]) if link.get("bandwidth") else device.intra.bandwidth)
        # Measured on one host: the intra-node link. Across nodes the profile knows nothing; keep the preset
        # unless the whole world sat on one node (then inter is never used).
        device = replace(device, intra=measured, inter=measured if cluster.nodes == 1 else device.inter)
    # The fitted FLOP rate was measured on whole layers: it already includes their element-wise work.
    device = replace(device, elementwise=False, sm_count=0, gemm_half_k=0.0, kernel_gap_s=0.0)
    return replace(cluster, device=device, costs=MeasuredCosts(doc))


class MeasuredCosts:
    """The cost source of a calibrated cluster (cost.source.CostSource): the figures of one profile document."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.held = {_normal(Strategy.from_json(rec["strategy"])) for rec in doc["layers"]}

    def holds(self, s):
        return _normal(s) in self.held

    def layer_cost(self, cluster, layer, s, micro_batch, workload):
        return measured_layer_cost(cluster, layer, s, micro_batch, workload)

    def pair_tables(self, cluster, nbytes, strategies, stages, stage_link, boundary_link):
        return pair_tables(cluster, nbytes, strategies, stages, stage_link, boundary_link)

    def adjust_tables(self, cluster, model, workload, strategies, stages, micro_batches, schedule, virtual_stages,
                      A, R, allowed):
        return adjust_tables(cluster, model, workload, strategies, stages, micro_batches, schedule, virtual_stages,
                             A, R, allowed)

    def plan_scale(self, cluster, schedule, stages, micro_batches, virtual_stages, chunk_times):
        return plan_scale(cluster, schedule, stages, micro_batches, virtual_stages, chunk_times)


def profile_of(cluster: ClusterSpec) -> dict:
    """The measured document a cluster is calibrated with ({} for an analytic cluster)."""
    return cluster.costs.doc if isinstance(cluster.costs, MeasuredCosts) else {}


# ---------------------------------------------------------------------------------------------------------
# Lookups used by cost.tables (cached per profile document)

class _Index:
    def __init__(self, doc: dict):
        self.doc = doc
        self.precision = doc["precision"]
        self.layers: dict[tuple, dict] = {}
        for rec in doc["layers"]:
            s = Strategy.from_json(rec["strategy"])
            self.layers[(rec["signature"], s)] = rec
        self.collectives = {(rec["op"], int(rec["n"])): Line.from_json(rec["fit"]) for rec in doc["collectives"]}
        self.sig_ids: dict[tuple, str] = {}

    def sig(self, signature: tuple) -> str:
        got = self.sig_ids.get(signature)
        if got is None:
            got = self.sig_ids[signature] = signature_id(signature)
        return got

    def comm(self, op: str, nbytes: float, n: int, link: Link) -> float:
        """Measured (op, n) fit when there is one, else the ring α–β of `link` (cost.comm)."""
        if nbytes <= 0 or (n <= 1 and op != "p2p"):
            return 0.0
        line = self.collectives.get((op, n))
        if line is not None:
            return line(nbytes)
        from uniap.cost import comm

        return comm.p2p(nbytes, link) if op == "p2p" else getattr(comm, op)(nbytes, n, link)


_CACHE: dict[int, tuple[dict, _Index]] = {}


def _index(cluster: ClusterSpec) -> _Index:
    doc = profile_of(cluster)
    hit = _CACHE.get(id(doc))
    if hit is None or hit[0] is not doc:
        hit = _CACHE[id(doc)] = (doc, _Index(doc))
    return hit[1]


def _normal(s: Strategy) -> Strategy:
    """The profile's key of a strategy (cp kept: a profile measures no context parallelism, so a cp strategy finds
    no record and is priced analytically)."""
    return Strategy(s.dp, s.tp, s.zero if s.dp > 1 else 0, s.recompute, s.sp, cp=s.cp)


def measured_layer_cost(cluster: ClusterSpec, layer, s: Strategy, micro_batch: int, workload):
    """(A, G, Ms, Ma) of `layer` under `s` from the profile, or None when the profile does not hold it."""
    idx = _index(cluster)
    if workload.precision != idx.precision:
        raise UniapError(f"the cluster's profile was measured in {idx.precision}; plan with --precision "
                         f"{idx.precision}")
    rec = idx.layers.get((idx.sig(layer.signature), _normal(s)))
    if rec is None:
        return None
    samples = micro_batch / s.dp
    A = Line.from_json(rec["fit"])(samples)
    Ma = Line.from_json(rec["act_fit"])(samples)
    G = float(rec["optimizer_s"])
    if s.dp > 1 and s.zero == 0:  # at the cost the profile measured beside a backward (`all_reduce_scale`)
        local = layer.params - layer.tp_params + layer.tp_params / s.tp
        G += idx.comm("all_reduce", 4.0 * local, s.dp, cluster.device.intra) * all_reduce_scale(cluster)
    return float(A), G, float(rec["static_bytes"]), float(Ma)


def runtime_reshard_time(idx: _Index, nbytes: float, a: Strategy, b: Strategy, d: int, link: Link) -> float:
    """runtime.relayout between adjacent layers of one stage of d ranks: layouts differ only by dp (sp runs as
    tp). Forward: all-gather of the source's blocks (nbytes/a.dp each) over all d ranks when a.dp > 1;
    backward: the same for the gradient blocks of b when b.dp > 1."""
    if a.dp == b.dp:
        return 0.0
    t = 0.0
    if a.dp > 1:
        t += idx.comm("all_gather", d * nbytes / a.dp, d, link)
    if b.dp > 1:
        t += idx.comm("all_gather", d * nbytes / b.dp, d, link)
    return t


def pair_tables(cluster: ClusterSpec, nbytes: float, strategies: list[Strategy], stages: int, link_stage: Link,
                link_boundary: Link) -> tuple[np.ndarray, np.ndarray]:
    """(R, Rp) between every pair of strategies for an activation of `nbytes` (whole micro-batch)."""
    idx = _index(cluster)
    d = cluster.devices // stages
    R = np.array([[runtime_reshard_time(idx, nbytes, a, b, d, link_stage) for b in strategies] for a in strategies])
    # The sender's local block travels to the same position of the next stage and its gradient comes back.
    send = np.array([2.0 * idx.comm("p2p", nbytes / a.dp, 2, link_boundary) for a in strategies])
    Rp = send[:, None] + R
    return R, Rp


def adjust_tables(cluster: ClusterSpec, model, workload, strategies: list[Strategy], stages: int, micro_batches: int,
                  schedule: str, virtual_stages: int, A: np.ndarray, R: np.ndarray, allowed: np.ndarray):
    """What the measured runtime does beyond the sum of its per-layer figures, for one pipeline configuration.

    1. contention (`concurrency_scale`, φ) on the per-micro-batch stage tables A and R;
    2. the pipeline machinery's per-slot cost (`pipeline_slot_cost`), added to A: per layer, whatever its
       strategy, its share of ε·sharing(b)·v per stage (`pipeline_overhead`);
    3. the runtime runs 1F1B with fewer micro-batches than stages as GPipe (torch's 1F1B needs c >= P), which
       keeps all c micro-batches in flight.
    Returns (A, R, schedule).
    """
    best = fastest_layer_times(cluster, model, workload, stages, micro_batches)
    known = np.isfinite(best)
    if not known.all():  # layers the profile lacks: their fastest entry in these tables
        table = np.where(allowed, np.asarray(A, dtype=float), np.inf).min(axis=1)
        best = np.where(known, best, table)
    best = np.where(np.isfinite(best), best, 0.0)
    phi = concurrency_scale(cluster, stages, micro_batches, virtual_stages, schedule)
    added = pipeline_overhead(cluster, stages, micro_batches, best, virtual_stages, schedule)
    return A * phi + added[:, None], R * phi, schedule_named(schedule).runs_as(stages, micro_batches).name


def pipeline_overhead(cluster: ClusterSpec, stages: int, micro_batches: int, fastest: np.ndarray,
                      virtual_stages: int = 1, schedule: str = "1f1b") -> np.ndarray:
    """(L,) seconds per micro-batch added to each layer, whatever its strategy, for the pipeline machinery.

    Its per-slot cost ε(P) (measured by the profile, slowed by the ranks sharing cores like the stages' compute,
    `pipeline_sharing`) sits on every slot of the schedule, v per micro-batch and stage when interleaved:
    ε·sharing·v per stage and micro-batch, spread over the chain's layers in proportion to their fastest time
    (`fastest_layer_times`), so that a balanced stage carries one ε whatever its strategies. (Until issue 24 it
    was a factor on every entry of A, 1 + ε·sharing·v/p̄: a strategy k times slower than the fastest carried k·ε,
    and a pipeline of slow tensor-parallel stages — on CPU, latency-bound by gloo — was over-predicted by up to
    2×.) 0 for one stage."""
    fastest = np.asarray(fastest, dtype=float)
    eps = pipeline_slot_cost(cluster, stages) if stages > 1 and profile_of(cluster) else 0.0
    total = float(fastest.sum())
    if eps <= 0 or total <= 0:
        return np.zeros_like(fastest)
    per_stage = eps * pipeline_sharing(cluster, stages, micro_batches, virtual_stages, schedule) * virtual_stages
    return per_stage * stages * fastest / total


def all_reduce_scale(cluster: ClusterSpec) -> float:
    """From the profile's whole-chain measurement (1 for profiles without it): ZeRO-0's all-reduces beside the
    backward, as a step runs them, against the all-reduce fit on an idle machine."""
    chain = profile_of(cluster).get("chain") or {}
    return float(chain.get("all_reduce_scale", 1.0))


def sharing(cluster: ClusterSpec, busy: float) -> float:
    """How much slower a rank computes with `busy` ranks computing at once than alone: ranks share the host's
    cores (max(1, busy / cores)) on CPU; each has its own device on GPU (1)."""
    cores = _cores(cluster)
    return max(1.0, busy / cores) if cores else 1.0


def _cores(cluster: ClusterSpec) -> int:
    """The cores the profile's ranks shared (0 where each rank had its own device)."""
    device = profile_of(cluster).get("device", {})
    return int(device.get("cores") or 0) if device.get("kind") == "cpu" else 0


def pipeline_sharing(cluster: ClusterSpec, stages: int, micro_batches: int, virtual_stages: int = 1,
                     schedule: str = "1f1b") -> float:
    """How much slower than alone a balanced pipeline's stages compute, on the whole, when its ranks share cores:
    the makespan of the schedule's own order on equal chunks, each stage progressing at 1/sharing(n·N/P) while n
    stages compute at once (`schedules.simulate_shared`), over the same order's makespan alone. sharing(N) for a
    single stage (all N ranks always busy); 1 where ranks do not share.

    An average count of busy ranks is not enough: sharing(b) = max(1, b/cores) is convex, so a pipeline whose ranks
    are sometimes all busy and sometimes few runs slower than at its mean (4 ranks on 2 cores in 4 stages, 4
    micro-batches: 1.29× alone by simulation, 1.14× at the mean of 2.3 busy ranks)."""
    world = int(profile_of(cluster).get("world_size") or 1)
    cores = _cores(cluster)
    if not cores:
        return 1.0
    if stages <= 1:
        return sharing(cluster, world)
    return _shared_makespan(schedule_named(schedule).runs_as(stages, micro_batches).name, stages, micro_batches,
                            virtual_stages, world, cores)


@functools.lru_cache(maxsize=1024)
def _shared_makespan(schedule: str, stages: int, micro_batches: int, virtual_stages: int, world: int,
                     cores: int) -> float:
    """`pipeline_sharing`'s ratio for one pipeline (cached: every table of a search asks for its (P, c, v))."""
    v = chunks_per_stage(schedule_named(schedule), virtual_stages)
    return _shared_ratio(schedule, stages, micro_batches, virtual_stages, np.ones(stages * v), world, cores)


def _shared_ratio(schedule: str, stages: int, micro_batches: int, virtual_stages: int, chunk_times: np.ndarray,
                  world: int, cores: int) -> float:
    """The makespan of the schedule's order on chunks of `chunk_times` (forward and backward per micro-batch,
    alone) with `world` ranks in `stages` stages sharing `cores`, over the same order's makespan alone."""
    chosen = schedule_named(schedule)
    v = chunks_per_stage(chosen, virtual_stages)
    fwd = [FORWARD_SHARE * float(t) for t in chunk_times]
    bwd = [(1.0 - FORWARD_SHARE) * float(t) for t in chunk_times]
    wgt = [b / 2.0 for b in bwd]  # a split backward's weight pass: about half of it (the other matmul)
    send = [0.0] * (len(fwd) - 1)
    ranks = world / stages
    shared = simulate_shared(chosen, stages, micro_batches, v, fwd, bwd, wgt, send,
                             lambda n: max(1.0, n * ranks / cores))
    alone = simulate_shared(chosen, stages, micro_batches, v, fwd, bwd, wgt, send, lambda n: 1.0)
    return shared / alone


def plan_scale(cluster: ClusterSpec, schedule: str, stages: int, micro_batches: int, virtual_stages: int,
               chunk_times: np.ndarray) -> float:
    """Factor on one plan's per-micro-batch figures, beyond its configuration's φ (`concurrency_scale`), where ranks
    share cores: `_shared_ratio` on the plan's own chunk times over the balanced chunks φ assumes. 1 for equal
    chunks, a single stage, and where ranks do not share.

    A plan with a much lighter stage keeps fewer ranks busy at once than balanced stages do, and its heavy stage
    has the cores to itself more often: the demo's pp2 mixed plan (a dp2 stage, then a tp2 stage three times
    slower) was over-predicted by 24 … 61 % with φ alone, in all runs of 4 to 7 December but one. φ stays what
    the search uses: its tables need one figure per configuration; `estimate.predict` applies this factor to the
    plan it prices. The formula on the scaled tables still bounds the plan's own shared-core simulation (the formula
    bounds the order alone, and both are stretched by the same simulated ratio)."""
    world = int(profile_of(cluster).get("world_size") or 1)
    cores = _cores(cluster)
    if not cores or stages <= 1:
        return 1.0
    times = np.asarray(chunk_times, dtype=float)
    if not np.all(np.isfinite(times)) or times.sum() <= 0:
        return 1.0
    own = min(1.0, _shared_ratio(schedule, stages, micro_batches, virtual_stages, times, world, cores)
              / sharing(cluster, world))
    return own / concurrency_scale(cluster, stages, micro_batches, virtual_stages, schedule)


def concurrency_scale(cluster: ClusterSpec, stages: int, micro_batches: int, virtual_stages: int = 1,
                      schedule: str = "1f1b") -> float:
    """Factor on per-micro-batch stage times (A, R) for a pipeline configuration: layer times are measured with
    every rank busy (N ranks sharing the cores: sharing(N) times slower than alone on this CPU); a pipeline's
    fill and drain leave stages idle, and its stages slow each other down less: pipeline_sharing / sharing(N).
    1 for a single stage and where ranks do not share (GPUs). A balanced pipeline is assumed; a plan's own stage
    times correct it where it is priced (`plan_scale`)."""
    if stages <= 1 or not profile_of(cluster):
        return 1.0
    full = sharing(cluster, int(profile_of(cluster)["world_size"]))
    return min(1.0, pipeline_sharing(cluster, stages, micro_batches, virtual_stages, schedule) / full)


def fastest_layer_times(cluster: ClusterSpec, model, workload, stages: int, micro_batches: int) -> np.ndarray:
    """(L,) per layer, the least measured per-micro-batch time over every strategy the profile holds for a stage
    of N/P ranks (inf where it holds none): a property of the configuration, not of which strategies a caller
    put in its tables, so a plan costs the same in `plan` and in `estimate --plan`."""
    idx = _index(cluster)
    d = int(idx.doc["world_size"]) // stages
    micro = workload.global_batch // micro_batches
    best: dict[str, float] = {}
    for rec in idx.doc["layers"]:
        s = rec["strategy"]
        dp = int(s["dp"])
        if int(rec["stage_size"]) != d or micro % dp:
            continue
        t = Line.from_json(rec["fit"])(micro / dp)
        if t < best.get(rec["signature"], np.inf):
            best[rec["signature"]] = t
    return np.array([best.get(idx.sig(layer.signature), np.inf) for layer in model.layers])


def pipeline_slot_cost(cluster: ClusterSpec, stages: int) -> float:
    """Measured per-slot cost of the pipeline machinery for `stages` stages (nearest measured degree; 0 if none)."""
    entries = profile_of(cluster).get("pipeline") or []
    if not entries:
        return 0.0
    best = min(entries, key=lambda e: (abs(int(e["stages"]) - stages), -int(e["stages"])))
    return float(best["per_slot_s"])


def describe(cluster: ClusterSpec) -> str | None:
    """One line naming the profile a cluster is calibrated with (None if analytic)."""
    doc = profile_of(cluster)
    if not doc:
        return None
    return (f"calibrated with a {doc['device']['kind']} profile of {doc['model']['name']} "
            f"({doc['world_size']} ranks, {doc['created']})")
