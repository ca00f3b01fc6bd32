"""Cost tables of one pipeline configuration: the numpy arrays the solver optimises over.

For P stages of d = N/P devices each and c micro-batches of B/c samples, every (layer u,
strategy k) gets A (fwd+bwd per micro-batch), G (once per iteration, not hidden by the pipeline),
Ms (static bytes), Ma (activation bytes per in-flight micro-batch); every adjacent pair gets R
(resharding inside a stage) and Rp (send across a stage boundary). One function builds them for
the planner, `estimate`, the baselines and the report alike, so a plan costs the same everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uniap.cost import comm
from uniap.cost.compute import (attention_seconds, backward_share, layer_time, optimizer_time, overlapped,
                               weight_gradient_time)
from uniap.cost.memory import (activation_bytes_per_sample, dense_params_per_device, expert_params_per_device,
                               static_bytes)
from uniap.errors import UniapError
from uniap.program import StageProgram
from uniap.spec.cluster import ClusterSpec, Link
from uniap.spec.model import LayerSpec, ModelSpec
from uniap.spec.ops import Attention
from uniap.schedules import Schedule, schedule_named
from uniap.spec.workload import Workload
from uniap.strategies import Strategy

NOT_RECOMPUTABLE = ("embedding", "head", "patch_embed")
# Layers whose GEMMs stay 16-bit under fp8 training: the LM head (torchtitan's float8 converter skips `output`;
# Megatron-LM keeps its output layer out of Transformer Engine's fp8 region) and the embedding look-up.
NOT_FP8 = ("embedding", "head", "patch_embed")


@dataclass(frozen=True)
class StageLinks:
    """The slowest link each kind of group spans, over all stages of one size (stages share tables)."""

    tp: dict[int, Link]  # by tp degree: contiguous ranks (also etp groups, by etp degree)
    dp: dict[int, Link]  # by tp degree (dp group = stride tp across the stage; edp groups: stride ep·etp)
    stage: Link  # all ranks of one stage (resharding between layouts)
    boundary: Link  # sender → receiver across a stage boundary
    ep: dict[tuple[int, int], Link]  # by (ep, etp): an ep group's all-to-all (ep ranks, stride etp)
    cp: dict[tuple[int, int], Link]  # by (tp, cp): a cp group's ring (cp ranks, stride tp)


_LINKS: dict[tuple, tuple[ClusterSpec, StageLinks]] = {}
"""`stage_links` per cluster, stage count and group shapes: a search asks again for every pipeline configuration
(the cluster is kept with its links, so its id is not reused while they are)."""


def stage_links(cluster: ClusterSpec, stages: int, strategies: list[Strategy]) -> StageLinks:
    """The links of every group a stage's strategies use (`StageLinks`)."""
    key = (id(cluster), stages, frozenset((s.tp, s.ep, s.etp, s.cp) for s in strategies))
    hit = _LINKS.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    if len(_LINKS) >= 1024:
        _LINKS.clear()
    links = _stage_links(cluster, stages, strategies)
    _LINKS[key] = (cluster, links)
    return links


def _stage_links(cluster: ClusterSpec, stages: int, strategies: list[Strategy]) -> StageLinks:
    d = cluster.devices // stages
    starts = np.arange(0, cluster.devices, d)[:, None]
    tp_links, dp_links, ep_links = {}, {}, {}
    strides = {s.tp for s in strategies} | {s.etp for s in strategies} | {s.ep * s.etp for s in strategies}
    for tp in sorted(strides):
        tp_first = starts + np.arange(0, d, tp)  # tp groups: tp contiguous ranks
        tp_links[tp] = _slowest(cluster, tp_first, tp_first + tp - 1, tp)
        dp_first = starts + np.arange(tp)  # dp groups: stride tp across the stage
        dp_links[tp] = _slowest(cluster, dp_first, dp_first + d - tp, d // tp)
    for ep, etp in sorted({(s.ep, s.etp) for s in strategies}):
        block = starts + np.arange(0, d, ep * etp)  # ep·etp contiguous ranks hold every expert once
        ep_first = (block[..., None] + np.arange(etp)).reshape(len(starts), -1)
        ep_links[ep, etp] = _all_to_all_link(cluster, ep_first, ep_first + (ep - 1) * etp, ep)
    cp_links = {}
    for tp, cp in sorted({(s.tp, s.cp) for s in strategies}):
        block = starts + np.arange(0, d, tp * cp)  # tp·cp contiguous ranks hold one dp replica
        cp_first = (block[..., None] + np.arange(tp)).reshape(len(starts), -1)
        cp_links[tp, cp] = _slowest(cluster, cp_first, cp_first + (cp - 1) * tp, cp)
    stage = _slowest(cluster, starts, starts + d - 1, d)
    senders = np.arange(0, cluster.devices - d)
    boundary = _slowest(cluster, senders, senders + d, 2) if stages > 1 else cluster.device.intra
    return StageLinks(tp_links, dp_links, stage, boundary, ep_links, cp_links)


def _all_to_all_link(cluster: ClusterSpec, first: np.ndarray, last: np.ndarray, size: int) -> Link:
    """The link an all-to-all of groups of `size` ranks from `first` to `last` sees, as comm.all_to_all prices it.

    Within a node: the intra-node link. Across N nodes, each rank sends (size − size/N)/size of its buffer to
    other nodes through its own network link (one NIC rail per GPU) while the rest moves over NVLink, so the
    network part sets the time: the Link's bandwidth is scaled so that comm.all_to_all's (size − 1)/size · B
    over it takes as long as (size − size/N)/size · B over one network link, and its per-peer latency is the
    network's.
    """
    nodes = int(np.max(cluster.node_of(last) - cluster.node_of(first))) + 1 if first.size else 1
    if nodes <= 1:
        return cluster.device.intra
    inter = cluster.device.inter
    remote = size - size / nodes  # peers on other nodes
    return Link(latency_s=inter.latency_s, bandwidth=inter.bandwidth * (size - 1) / remote)


def _slowest(cluster: ClusterSpec, first: np.ndarray, last: np.ndarray, size: int) -> Link:
    """The ring link of groups of `size` ranks from `first` to `last` (ranks fill nodes in order).

    Within a node: the intra-node link. Across nodes: a per-step latency that averages the ring's hops — a ring
    over n ranks on N nodes makes n − 1 steps, of which N − 1 cross the network and the rest stay on NVLink
    (NCCL's own ring latency model, src/graph/tuning.cc) — and a bandwidth of one network link per rank of the
    group on a node, at most the intra-node one: NCCL runs one ring channel per NIC rail, so a group with g ranks
    per node crosses the network g links wide (nccl-tests all-reduce on 2–8 nodes of 8 H100 with 8 × 400 Gb/s:
    385–470 GB/s busbw where one NIC gives 50 GB/s; benchmarks/data/nccl_tests.yaml). Its all-gather and
    reduce-scatter steps cost at least RING_STEP_ACROSS_NODES_S each (Link.gather_latency_s), and its bandwidth falls
    with the node count past 4 nodes (fabric_share). Both from the published figures at scale, below.
    """
    nodes = int(np.max(cluster.node_of(last) - cluster.node_of(first))) + 1 if len(first) else 1
    if nodes <= 1:
        return cluster.device.intra
    intra, inter = cluster.device.intra, cluster.device.inter
    steps = max(size - 1, 1)
    net_steps = min(nodes - 1, steps)
    latency = (net_steps * inter.latency_s + (steps - net_steps) * intra.latency_s) / steps
    gather_step = max(intra.latency_s, RING_STEP_ACROSS_NODES_S)
    gather = (net_steps * inter.latency_s + (steps - net_steps) * gather_step) / steps
    per_node = max(1, size // nodes)
    return Link(latency_s=latency, bandwidth=min(intra.bandwidth, inter.bandwidth * per_node) * fabric_share(nodes),
                gather_latency_s=gather)


# α of every step of a ring all-gather / reduce-scatter that spans nodes (at least; NVLink's is below it): 14 µs,
# NCCL's own figure for a ring step over the network (src/graph/tuning.cc, hwLatencies[NET][Ring][Simple] = 14.0 since
# NCCL 2.18.1; NVIDIA/nccl@5067397c). A ring over n ranks on N nodes is one pipeline whose every step waits on the
# network hops of the others, and NCCL's model itself raises the steps inside a node to its per-step network
# overhead in a multi-node ring ("Inter-node rings still have to launch nsteps * net overhead"). NCCL runs these two
# collectives only as rings across nodes (its PAT needs one GPU per node; NVIDIA/nccl#1473), so unlike an all-reduce,
# which it may run as a tree, no other algorithm takes their latency down. Taken from NCCL, not fitted, and checked:
# `python benchmarks/published_runs.py --ring-step-grid` prints the calibration rows' mean squared log error and both
# splits' errors over 0-25 µs (the calibration error falls up to about 20 µs; every validation row is within 15 % from
# 8 to 20 µs, and without it llm-foundry's 1B on 512 H100 is not), and NVIDIA/nccl#1218's 2 GiB all-gather on 256
# H100 (~200 GB/s) is met within a few per cent (benchmarks/nccl_busbw.py). All-reduce keeps the ring latency
# above, which matches the 2-8-node all-reduce rows of benchmarks/data/nccl_tests.yaml.
RING_STEP_ACROSS_NODES_S = 14e-6


# A ring's bus bandwidth across many nodes falls with the node count: the fabric (leaf and spine tiers of a rail-
# optimised fat tree, adaptive routing) does not carry every rail at line rate once a ring leaves a leaf switch. The
# one published series beyond 64 nodes: NVIDIA/nccl#1229 (2024-03-16), nccl-tests reduce_scatter on H100 nodes of 8
# GPUs, "4/8/16/32/64/128 nodes ... 360, 345, 320, 300, 280, 260" GB/s busbw: −5.7 % of the 4-node figure per doubling
# of the nodes (a least-squares line in log2 nodes, benchmarks/nccl_busbw.py prints it), the 4-node figure being what
# the model gives without it (8 × 45 GB/s). Not extrapolated past the 128 nodes measured. NVIDIA/nccl#1218 (all_gather,
# 2 GiB, 32 nodes of 8 H100: "only achieves 200GBps") is lower still.
FABRIC_DECLINE = 0.057  # per doubling of the nodes a ring spans, beyond FABRIC_FROM_NODES
FABRIC_FROM_NODES = 4
FABRIC_UPTO_NODES = 128


def fabric_share(nodes: int) -> float:
    """The share of its network bandwidth a ring over `nodes` nodes reaches (1 up to 4 nodes; NVIDIA/nccl#1229)."""
    if nodes <= FABRIC_FROM_NODES:
        return 1.0
    return 1.0 - FABRIC_DECLINE * math.log2(min(nodes, FABRIC_UPTO_NODES) / FABRIC_FROM_NODES)


def disallowed(layer: LayerSpec, s: Strategy, micro_batch: int) -> str | None:
    """Why layer cannot run under s (None if it can): dp must split the micro-batch, tp must divide
    heads/FFN/…, sp the tokens, ep the experts and etp an expert's inner size, cp the tokens into 2·cp
    load-balanced chunks; a dense layer has no experts to place; embeddings and heads are not recomputed, and a
    layer without attention has no attention core to recompute selectively."""
    if micro_batch % s.dp:
        return f"dp {s.dp} does not divide the micro-batch of {micro_batch} samples"
    if s.moe and not layer.experts:
        return f"{layer.name} has no routed experts (ep {s.ep}, etp {s.etp} apply to MoE layers only)"
    if layer.experts and layer.experts % s.ep:
        return f"ep {s.ep} does not divide the {layer.experts} experts of {layer.name}"
    if layer.experts and layer.expert_ffn % s.etp:
        return f"etp {s.etp} does not divide the expert inner size {layer.expert_ffn} of {layer.name}"
    for size in layer.tp_divides:
        if size % s.tp:
            return f"tp {s.tp} does not divide {size} ({layer.name}: heads, FFN or vocabulary)"
    if s.cp > 1 and layer.tokens % (2 * s.cp):
        return f"cp {s.cp} does not split the {layer.tokens} tokens of {layer.name} into {2 * s.cp} equal chunks"
    if s.sp and (layer.tokens // s.cp) % s.tp:
        return f"sequence parallel tp {s.tp} does not divide the {layer.tokens // s.cp} tokens of {layer.name}" + \
            (f" on each of cp {s.cp}" if s.cp > 1 else "")
    if s.recompute != "none" and layer.kind in NOT_RECOMPUTABLE:
        return f"{layer.name} ({layer.kind}) is not recomputed"
    if s.recompute in ("selective", "selective-op") and not any(isinstance(op, Attention) for op in layer.ops):
        return f"{layer.name} has no attention core to recompute selectively"
    return None


def layer_cost(layer: LayerSpec, s: Strategy, micro_batch: int, cluster: ClusterSpec, workload: Workload,
               links: StageLinks, compute: float | None = None, after_step: bool = False
               ) -> tuple[float, float, float, float]:
    """(A, G, Ms, Ma) of one layer under one strategy; see the module docstring. `after_step`: the gradient
    all-reduce runs after the step, hidden behind nothing (a split backward's weight passes assign the gradients
    outside autograd's hooks, so `uniap run` reduces them once the schedule is done).

    A cluster with a measured cost source (cluster.costs, see cost.source) answers from its measurements
    first; layers and strategies it did not measure fall through to the analytic model. `compute`: the layer's
    `layer_compute` under s, when the caller has it (strategies differing in ZeRO stage alone share it).
    """
    if cluster.costs is not None:
        measured = cluster.costs.layer_cost(cluster, layer, s, micro_batch, workload)
        if measured is not None:
            return measured
    device = cluster.device
    samples = micro_batch / s.dp / s.cp  # per device, in samples' worth of tokens (cp: 1/cp of each sample)
    act_bytes = workload.act_bytes
    imbalance = workload.expert_imbalance if layer.experts else 1.0
    if compute is None:
        compute = layer_compute(layer, s, micro_batch, cluster, workload)
    passes = 3.0 if s.full else 2.0  # forward, backward, and the recomputed forward
    # torchtitan's op policy keeps reduce-scatter outputs but not all-gathers or all-reduces: it runs the forward's
    # all-gathers (half of sp's volume) or all-reduces again in backward
    tp_passes = passes + ((0.5 if s.sp else 1.0) if s.recompute == "selective-op" else 0.0)

    # Tensor parallelism: the forward's all-reduces (reduce-scatter + all-gather with sp: same volume),
    # the same again in backward, and once more when the forward is recomputed (selective recompute re-runs
    # the attention core alone, which has no tp collective). Not overlapped.
    tp_bytes = layer.tp_comm_elems * samples * act_bytes
    tp_time = tp_passes * comm.all_reduce(tp_bytes, s.tp, links.tp[s.tp])
    if cluster.engine.tp_overlap and s.sp:  # chunked behind the GEMMs (Engine.tp_overlap): what they cannot cover
        tp_time = overlapped(compute, tp_time, device.overlap_slowdown) - compute
    expert_time = passes * _expert_exchange(layer, s, samples * act_bytes * imbalance, links)
    context_time = _context_exchange(layer, s, samples, cluster, workload, links)

    # Data parallelism over the dp group (ZeRO stages as in Rajbhandari et al. 2020); the routed experts' over
    # their edp group. It overlaps with compute, as FSDP2's prefetching and Megatron's
    # --overlap-grad-reduce/--overlap-param-gather do: only the part longer than the compute it hides behind
    # counts, and compute runs slower while it overlaps.
    grad_elem = 4.0 if workload.precision == "fp32" else 2.0
    dense = _data_parallel(dense_params_per_device(layer, s) * grad_elem, s.replicas, s.zero, links.dp[s.tp])
    expert = _data_parallel(expert_params_per_device(layer, s) * grad_elem, s.edp, s.zero, links.dp[s.ep * s.etp])
    fwd_micro, bwd_micro, sync = (a + b for a, b in zip(dense, expert))
    shard = (dense_params_per_device(layer, s) / (s.replicas if s.zero >= 1 else 1)
             + expert_params_per_device(layer, s) / (s.edp if s.zero >= 1 else 1))
    # Once per iteration: DDP's all-reduce hides behind the last micro-batch's backward; ZeRO-1/2's
    # reduce-scatter behind the backward and their parameter all-gather behind the next forward.
    window = compute * (backward_share(s.full) if s.zero == 0 else 1.0)
    if after_step or not sync:
        exposed_sync = sync
    else:
        exposed_sync = overlapped(window, sync, device.overlap_slowdown) - window
    once = exposed_sync + optimizer_time(device, shard)

    A = data_parallel_overlap(compute, forward_share(s.full), fwd_micro, bwd_micro, device.overlap_slowdown) \
        + tp_time + expert_time + context_time
    Ms = static_bytes(layer, s, workload.precision)
    Ma = micro_batch / s.dp * activation_bytes_per_sample(layer, s, workload.precision, flash_attention=cluster.engine.flash,
                                               imbalance=imbalance)
    return A, once, Ms, Ma


def layer_compute(layer: LayerSpec, s: Strategy, micro_batch: int, cluster: ClusterSpec, workload: Workload) -> float:
    """Forward + backward (+ recomputed forward) seconds of one layer call under s, on one device (cost.compute)."""
    imbalance = workload.expert_imbalance if layer.experts else 1.0
    peak, fp8_peak = compute_peaks(cluster, workload, layer)
    return layer_time(cluster.device, cluster.engine, peak, layer, micro_batch / s.dp / s.cp, s.tp, s.sp, s.recompute,
                      act_scale=workload.act_bytes / 2, experts=(s.ep, s.etp, imbalance), fp8_peak=fp8_peak)


def weight_gradient_seconds(layer: LayerSpec, s: Strategy, micro_batch: int, cluster: ClusterSpec,
                            workload: Workload) -> float:
    """The weight-gradient GEMMs' seconds of one layer call under s, on one device (part of `layer_compute`)."""
    imbalance = workload.expert_imbalance if layer.experts else 1.0
    peak, fp8_peak = compute_peaks(cluster, workload, layer)
    return weight_gradient_time(cluster.device, peak if fp8_peak <= 0 else fp8_peak, layer, micro_batch / s.dp / s.cp,
                                s.tp, experts=(s.ep, s.etp, imbalance), fp8=fp8_peak > 0)


def compute_peaks(cluster: ClusterSpec, workload: Workload, layer: LayerSpec) -> tuple[float, float]:
    """(peak of everything but fp8 GEMMs, peak of the layer's fp8 GEMMs or 0): fp8 training runs attention and the
    16-bit layers at the bf16 peak."""
    if workload.precision != "fp8":
        return cluster.peak(workload.precision), 0.0
    return cluster.peak("bf16"), (0.0 if layer.kind in NOT_FP8 else cluster.peak("fp8"))


def _context_exchange(layer: LayerSpec, s: Strategy, samples: float, cluster: ClusterSpec, workload: Workload,
                      links: StageLinks) -> float:
    """The exposed part of context parallelism's key/value exchange, per device and micro-batch.

    Each device gathers the keys and values of the other cp − 1 ranks' tokens (a ring of cp − 1 steps, Megatron-LM's
    p2p context parallelism; Llama 3's all-gather moves the same bytes) and backward returns their gradients and
    circulates them again (twice the forward's bytes); a recomputed attention kernel gathers once more. The ring overlaps
    each step's transfer with the attention of the chunk already held, so what the attention kernels' time covers
    of the cp − 1 steps is hidden (the first chunk has no transfer to hide)."""
    if s.cp == 1:
        return 0.0
    nbytes = 0.0
    for op in layer.ops:
        if isinstance(op, Attention):
            kv_heads = max((op.kv_heads or op.heads) / s.tp, 1.0)
            nbytes += samples * layer.tokens * kv_heads * (op.head_dim + (op.value_dim or op.head_dim))
    if not nbytes:
        return 0.0
    gather = comm.all_gather(nbytes * s.cp * workload.act_bytes, s.cp, links.cp[s.tp, s.cp])  # every chunk's K, V
    peak, _ = compute_peaks(cluster, workload, layer)
    fwd, bwd = attention_seconds(cluster.device, cluster.engine, peak, layer, samples, s.tp)
    hidden = (s.cp - 1) / s.cp
    exposed = max(0.0, gather - hidden * fwd) + max(0.0, 2 * gather - hidden * bwd)
    if s.recompute in ("selective", "full"):  # the op policy keeps the attention's output: nothing to gather again
        exposed += max(0.0, gather - hidden * fwd)
    return exposed


def _data_parallel(grad_bytes: float, replicas: int, zero: int, link: Link) -> tuple[float, float, float]:
    """(every micro-batch's forward, every micro-batch's backward, once per iteration) communication of `grad_bytes`
    of gradients over `replicas` ranks: ZeRO-3 gathers the parameters for the forward (forward) and again for the
    backward, and ZeRO-2/3 reduce-scatter the gradients (backward); DDP/ZeRO-1's all-reduce or ZeRO-2's all-gather
    of the updated shards once."""
    fwd = bwd = 0.0
    if zero >= 2:
        bwd += comm.reduce_scatter(grad_bytes, replicas, link)
    if zero >= 3:
        gather = comm.all_gather(grad_bytes, replicas, link)
        fwd += gather
        bwd += gather
    if zero <= 1:
        sync = comm.all_reduce(grad_bytes, replicas, link)
    elif zero == 2:
        sync = comm.all_gather(grad_bytes, replicas, link)
    else:
        sync = 0.0
    return fwd, bwd, sync


def forward_share(full_recompute: bool) -> float:
    """Fraction of a layer call's compute that runs in the forward pass: a third (the backward does twice its
    work), a quarter when the whole forward runs again in the backward (cost.compute.backward_share's complement
    counts that recomputed forward as neither)."""
    return 1.0 / 4.0 if full_recompute else 1.0 / 3.0


def data_parallel_overlap(compute: float, forward: float, fwd_comm: float, bwd_comm: float, slowdown: float) -> float:
    """One layer call's time with its per-micro-batch data-parallel traffic beside it: the forward's parameter gather
    hides only behind the forward (`forward`: its share of `compute`, forward_share; FSDP prefetches it during the
    layer before), the backward's gather and gradient reduce-scatter only behind the rest, the backward with any
    recomputed forward. Each half is `overlapped`; a layer whose forward is shorter than its gather pays the rest,
    even where its backward could have hidden it: the windows are the layer's own, with one micro-batch per step or
    many."""
    if not fwd_comm and not bwd_comm:
        return compute
    fwd, bwd = compute * forward, compute * (1.0 - forward)
    return (overlapped(fwd, fwd_comm, slowdown) if fwd_comm else fwd) + \
        (overlapped(bwd, bwd_comm, slowdown) if bwd_comm else bwd)


def _expert_exchange(layer: LayerSpec, s: Strategy, bytes_per_elem: float, links: StageLinks) -> float:
    """One pass's token exchange of an MoE layer (per device; not overlapped): dispatch and combine, each an
    all-to-all over the ep group of the device's routed token copies (1/tp of the dp shard's: the stage's devices
    share the tokens), and with etp > 1 an all-gather of the dispatched tokens over the etp group and a
    reduce-scatter of the experts' outputs. `bytes_per_elem` includes the micro-batch share and the imbalance."""
    if not layer.experts:
        return 0.0
    nbytes = layer.routed_elems * bytes_per_elem / s.tp
    exchange = 2 * comm.all_to_all(nbytes, s.ep, links.ep[s.ep, s.etp])
    if s.etp > 1:
        exchange += 2 * comm.all_gather(nbytes * s.etp, s.etp, links.tp[s.etp])
    return exchange


def shards(s: Strategy) -> int:
    """Into how many pieces the inter-layer activation is split: dp by batch, cp by sequence, × tp by sequence
    with sp."""
    return s.dp * s.cp * (s.tp if s.sp else 1)


def reshard_time(nbytes: float, a: Strategy, b: Strategy, link: Link) -> float:
    """Moving an activation of `nbytes` (whole micro-batch) from layout a to layout b, plus its gradient back.

    Fewer pieces on the receiving side means gathering (forward), more means slicing locally
    (forward) and gathering the gradient (backward): either way one gather of the difference.
    Equal piece counts with different layouts (sp vs batch split) need an all-to-all each way.
    """
    if a.layout == b.layout:
        return 0.0
    sa, sb = shards(a), shards(b)
    if sa == sb:
        return 2 * comm.all_to_all(nbytes / sa, max(a.tp * a.cp, b.tp * b.cp), link)
    lo, hi = min(sa, sb), max(sa, sb)
    return comm.all_gather(nbytes / lo, hi // lo, link)


def send_time(nbytes: float, a: Strategy, b: Strategy, link: Link) -> float:
    """Activation to the next stage (each receiver gets its own piece) and its gradient back."""
    return comm.p2p(nbytes / shards(b), link) + comm.p2p(nbytes / shards(a), link)


def _pair_tables(nbytes: float, strategies: list[Strategy], links: StageLinks) -> tuple[np.ndarray, np.ndarray]:
    """R and Rp for one activation size: both depend on the two layouts only, so price each layout pair once."""
    layouts = sorted({s.layout for s in strategies})
    rep = {s.layout: s for s in reversed(strategies)}
    index = np.array([layouts.index(s.layout) for s in strategies])
    r = np.array([[reshard_time(nbytes, rep[a], rep[b], links.stage) for b in layouts] for a in layouts])
    rp = np.array([[send_time(nbytes, rep[a], rep[b], links.boundary) for b in layouts] for a in layouts])
    pick = np.ix_(index, index)
    return r[pick], rp[pick]


def build_program(model: ModelSpec, cluster: ClusterSpec, workload: Workload, stages: int, micro_batches: int,
                  strategies: list[Strategy], schedule: str = "1f1b", virtual_stages: int = 1,
                  cache: dict | None = None, rows: tuple | None = None) -> StageProgram:
    """Tables for P = `stages` stages and c = `micro_batches`, over `strategies` (all with dp·tp = N/P).

    Several chunks per stage (`virtual_stages` v > 1): the program cuts the chain into P·v chunks, chunk j on the
    device group the schedule places it (j mod P, or a V: `placement`); its boundaries are all priced as stage
    boundaries (under a V the middle one stays on the last stage: priced as a send all the same). Only the chunk
    count and the in-flight counts depend on v, so a caller building the v's of one (P, c) in a row passes a
    `cache` (a dict it keeps) and the layers are priced once: it holds the last (P, c, strategies) priced, and
    every (P, c)'s weight-pass shares. `rows`:
    `signature_costs` of these strategies when the caller already has them."""
    n = cluster.devices
    if stages < 1 or n % stages:
        raise UniapError(f"pipeline degree {stages} does not divide the {n} devices")
    schedule_named(schedule).check(stages, micro_batches, virtual_stages)
    if stages * virtual_stages > len(model.layers):
        what = f"{stages} stages × {virtual_stages} virtual stages" if virtual_stages > 1 else f"pipeline degree {stages}"
        raise UniapError(f"{what} exceeds the model's {len(model.layers)} layers")
    if micro_batches < 1 or workload.global_batch % micro_batches:
        raise UniapError(f"global batch {workload.global_batch} does not split into {micro_batches} micro-batches")
    d = n // stages
    bad = [s for s in strategies if s.devices != d]
    if bad:
        raise UniapError(f"strategy {bad[0].label()} uses {bad[0].devices} devices but a stage has {d}")
    split = schedule_named(schedule).split_backward
    key = (stages, micro_batches, tuple(strategies), split)
    if cache is None or key not in cache:
        priced = _priced(model, cluster, workload, stages, micro_batches, strategies, rows, after_step=split)
        if cache is not None:
            shares = cache.get("split")
            cache.clear()
            cache[key] = priced
            if shares is not None:
                cache["split"] = shares
    A, G, Ms, Ma, R, Rp, ok = cache[key] if cache is not None else priced
    if cluster.costs is not None:  # what the measured runtime does beyond the per-layer figures
        A, R, schedule = cluster.costs.adjust_tables(cluster, model, workload, strategies, stages, micro_batches,
                                                     schedule, virtual_stages, A, R, ok)
    groups = _group_ids(model.layers)
    ran = schedule_named(schedule)
    weights = None
    if split:  # ZeRO-0 only, as `uniap run` trains it (FSDP2 fails under torch's weight pass, runtime.checks)
        ok = ok & np.array([s.zero == 0 for s in strategies])[None, :]
        kept = {} if cache is None else cache.setdefault("split", {})  # per (P, c), whatever v; every (P, c) kept
        if key not in kept:
            kept[key] = weight_gradient_shares(model, cluster, workload, micro_batches, strategies, ok)
        weights = np.where(ok, kept[key] * np.asarray(A, dtype=float), 0.0)
    return StageProgram(A=A, G=G, Ms=Ms, Ma=Ma, R=R, Rp=Rp, allowed=ok, stages=stages * virtual_stages,
                        micro_batches=micro_batches,
                        inflight=np.array(ran.inflight(stages, micro_batches, virtual_stages), dtype=float),
                        memory_capacity=cluster.memory_capacity, group=groups, virtual_stages=virtual_stages,
                        held=held_array(ran, stages, micro_batches, virtual_stages) if ran.interleaved else None,
                        placement=placement(ran, stages, virtual_stages),
                        weight_gradient=weights, split_schedule=ran.name if ran.split_backward else None,
                        schedule=ran.name)


def weight_gradient_shares(model: ModelSpec, cluster: ClusterSpec, workload: Workload, micro_batches: int,
                           strategies: list[Strategy], ok: np.ndarray) -> np.ndarray:
    """(L, K) the share of A that is the weight-gradient pass W (the schedules that split the backward defer it):
    each layer's weight-gradient GEMM time over its analytic compute (`cost.compute.weight_gradient_seconds` over
    `layer_compute`); a measured A is split by the same share. Priced once per signature."""
    micro = workload.global_batch // micro_batches
    index, firsts = _signature_rows(model)
    share = np.zeros((len(firsts), len(strategies)))
    for r, u in enumerate(firsts):
        layer = model.layers[u]
        for k in np.flatnonzero(ok[u]):
            total = layer_compute(layer, strategies[k], micro, cluster, workload)
            share[r, k] = weight_gradient_seconds(layer, strategies[k], micro, cluster, workload) / total \
                if total > 0 else 0.0
    return share[index]


def _signature_rows(model: ModelSpec) -> tuple[np.ndarray, list[int]]:
    """(the row of each layer, the first layer of each row): layers of one signature cost alike."""
    row_of: dict[object, int] = {}
    index = np.array([row_of.setdefault(layer.signature or (u,), len(row_of)) for u, layer in enumerate(model.layers)])
    return index, [int(np.argmax(index == r)) for r in range(len(row_of))]


def _priced(model: ModelSpec, cluster: ClusterSpec, workload: Workload, stages: int, micro_batches: int,
            strategies: list[Strategy], rows: tuple | None = None, after_step: bool = False) -> tuple[np.ndarray, ...]:
    """A, G, Ms, Ma, R, Rp and allowed of one (P, c) before any measured adjustment (`after_step`: as
    `layer_cost`'s)."""
    micro = workload.global_batch // micro_batches
    links = stage_links(cluster, stages, strategies)
    L, K = len(model.layers), len(strategies)
    index, costs, good = rows or signature_costs(model, cluster, workload, stages, micro_batches, strategies, links,
                                                 after_step)
    A, G, Ms, Ma = (costs[index, :, j] for j in range(4))
    ok = good[index]
    pair_cache: dict[float, int] = {}  # bytes an edge carries → its tables' index in `tables`
    tables: list[tuple[np.ndarray, np.ndarray]] = []
    edge = np.empty(max(L - 1, 0), dtype=int)
    for u in range(L - 1):
        nbytes = model.layers[u].out_elems * micro * workload.act_bytes
        if nbytes not in pair_cache:
            pair_cache[nbytes] = len(tables)
            measured = cluster.costs  # measured collectives, the runtime's re-layouts
            tables.append(_pair_tables(nbytes, strategies, links) if measured is None else
                          measured.pair_tables(cluster, nbytes, strategies, stages, links.stage, links.boundary))
        edge[u] = pair_cache[nbytes]
    stacked = [np.stack([np.asarray(t[j], dtype=float) for t in tables]) if tables else np.empty((0, K, K))
               for j in (0, 1)]
    # every edge carrying the same bytes (a decoder's chain): one read-only view, not an (L − 1)·K·K copy
    R, Rp = (np.broadcast_to(s[0], (L - 1, K, K)) if len(tables) == 1 else s[edge] for s in stacked)
    return A, G, Ms, Ma, R, Rp, ok


def signature_costs(model: ModelSpec, cluster: ClusterSpec, workload: Workload, stages: int, micro_batches: int,
                    strategies: list[Strategy], links: StageLinks | None = None, after_step: bool = False
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row of each layer (L,), (A, G, Ms, Ma) per row and strategy (R, K, 4), allowed (R, K)): layers of one
    signature share one row of costs (analytic; a measured cost source answers first, as in layer_cost).
    `after_step`: the gradient all-reduce runs after the step (a schedule that splits the backward)."""
    micro = workload.global_batch // micro_batches
    links = links or stage_links(cluster, stages, strategies)
    index, first = _signature_rows(model)
    firsts = [model.layers[u] for u in first]
    costs = np.zeros((len(firsts), len(strategies), 4))
    good = np.zeros((len(firsts), len(strategies)), dtype=bool)
    for r, layer in enumerate(firsts):
        computed: dict[tuple, float] = {}  # strategies differing in ZeRO stage alone compute alike
        for k, s in enumerate(strategies):
            good[r, k] = disallowed(layer, s, micro) is None
            if good[r, k]:
                shape = (s.dp, s.tp, s.sp, s.recompute, s.ep, s.etp, s.cp)
                if cluster.costs is None and shape not in computed:
                    computed[shape] = layer_compute(layer, s, micro, cluster, workload)
                costs[r, k] = layer_cost(layer, s, micro, cluster, workload, links, computed.get(shape), after_step)
    return index, costs, good


def _group_ids(layers) -> np.ndarray:
    """Consecutive layers with one signature share a group id: the solver folds them."""
    ids, current, last = [], -1, object()
    for layer in layers:
        sig = layer.signature or object()
        if sig != last:
            current += 1
        ids.append(current)
        last = sig
    return np.array(ids, dtype=int)


def placement(schedule: Schedule, stages: int, virtual_stages: int) -> np.ndarray | None:
    """StageProgram.placement: each chunk's device group where the schedule does not put chunk j on j mod P."""
    chunks = np.arange(stages * virtual_stages)
    groups = np.array([schedule.stage_of_chunk(int(j), stages) for j in chunks], dtype=int)
    return None if np.array_equal(groups, chunks % stages) else groups


def held_array(schedule: Schedule, stages: int, micro_batches: int, virtual_stages: int) -> np.ndarray:
    """`Schedule.held_patterns` as StageProgram.held: (P, n, v), padded with zero rows."""
    patterns = schedule.held_patterns(stages, micro_batches, virtual_stages)
    out = np.zeros((stages, max(len(p) for p in patterns), virtual_stages))
    for d, rows in enumerate(patterns):
        out[d, :len(rows)] = rows
    return out
