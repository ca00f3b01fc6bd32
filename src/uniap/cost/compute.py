"""Compute time of one layer call, priced per operator (spec.ops) on the per-device shard.

- GEMMs by their shape: 2·m·n·k FLOPs at the device's sustained GEMM efficiency, reduced by tile and wave
  quantisation (output tiles of 256×128 spread over the SMs in whole waves; NVIDIA's "Matrix
  Multiplication Background" guide) and by a short inner dimension (operand loads dominate: k/(k + k½)).
  Backward runs two GEMMs per forward GEMM, each with its own shape: dX = dY·Wᵀ (m, k, n) and
  dW = Xᵀ·dY (k, n, m).
- The routed experts' GEMMs (GroupedGemm) as one grouped kernel over the experts a device holds: experts/ep
  GEMMs whose rows are the tokens each expert receives from the device's expert-data-parallel share of the
  micro-batch, times the workload's load-imbalance factor (the busiest device sets the pace), tiles and waves
  counted over the whole group.
- Attention as its own kernel. Flash attention skips the masked half of a causal score matrix and runs at
  the device's attention efficiency (its backward does 2.5× the forward's matmul work: FlashAttention-2
  recomputes the scores, Dao 2023 §3.1). Standard attention is two batched GEMMs over the whole score
  matrix plus a softmax that streams it through memory.
- Memory-bound operators by the bytes they move over HBM, which depend on the engine: fused kernels
  read and write each tensor once, eager PyTorch makes a round trip per operator (ELEMENTWISE below).
- fp8 (Workload precision "fp8"): the blocks' GEMMs run at the device's fp8 peak and fp8 GEMM efficiency, and pay
  the scaled casts of their operands (input and weight in forward, the output gradient in backward) and the
  transposed fp8 copies Hopper's fp8 GEMMs need in backward, as memory-bound kernels (FP8_CAST below).
- Selective recomputation runs once more in backward: each attention kernel's forward (Korthikanti et al. 2022's
  attention core), or under torchtitan's op policy every element-wise operator's forward and half of the GEMMs'
  (it keeps the output of every second matmul and of the attention kernel, and recomputes the rest).
- Every kernel pays a fixed gap on the device timeline; a layer call pays the device's dispatch overhead.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from uniap.spec.cluster import DeviceType
from uniap.spec.engine import Engine
from uniap.spec.model import LayerSpec
from uniap.spec.ops import Attention, Elementwise, Gemm, GroupedGemm

TILE_M, TILE_N = 256, 128  # cuBLAS/CUTLASS's large bf16 tile (NVIDIA, Matrix Multiplication Background guide)
FLASH_BACKWARD_WORK = 2.5  # FlashAttention-2 backward: 5 matmuls of the forward's 2 (Dao 2023, §3.1)

# Forward bytes moved per element with 16-bit activations and kernels launched, (fused, eager), for each
# element-wise kind. Backward moves about twice the forward's bytes (reads the output gradient and the
# saved input, writes the input gradient) in as many kernels. Counted from the operators each engine runs
# (Megatron-LM's fused kernels; PyTorch eager's composition) — estimates, not measurements. (Backward kernels
# pay their gaps too: the backward time is twice the forward's, gaps included.)
ELEMENTWISE: dict[str, tuple[tuple[float, int], tuple[float, int]]] = {
    # LayerNorm: one native kernel either way (read x, write y).
    "norm": ((4.0, 1), (4.0, 1)),
    # RMSNorm in eager PyTorch (Llama, torchtitan): x.float(), pow/mean, x·rsqrt, cast, ·weight — five
    # kernels, fp32 intermediates: ~28 B/element. Fused (Apex/TE): read x, write y.
    "rmsnorm": ((4.0, 1), (28.0, 5)),
    # GeLU after a linear whose bias is added by the GEMM: read, write.
    "bias_gelu": ((4.0, 1), (4.0, 1)),
    # SwiGLU over the f outputs: fused reads gate and up, writes out (6 B); eager silu(gate) then · up (10 B).
    "swiglu": ((6.0, 1), (10.0, 2)),
    # residual add: read two, write one.
    "residual": ((6.0, 1), (6.0, 1)),
    # dropout: fused into the residual add (only its 1-byte mask is written); eager: read, write, mask.
    "dropout": ((1.0, 0), (5.0, 1)),
    # rotary embedding of q and k: fused read/write; eager (complex multiply in fp32 and back) ~24 B, 4 kernels.
    "rotary": ((4.0, 1), (24.0, 4)),
    # softmax over materialised scores (standard attention): fused scale-mask-softmax read/write; eager
    # scale, masked_fill and softmax, each a round trip.
    "softmax": ((4.0, 1), (12.0, 3)),
    # embedding gather: read the rows, write the output.
    "embedding": ((4.0, 1), (4.0, 1)),
    # MoE token permutation into expert order (a gather of each routed copy: read, write) and back (weighted by
    # the routing probabilities and summed over a token's k copies), each over the s·k·h routed elements; fused
    # (Megatron's --moe-permute-fusion) one kernel each, eager an index and a gather/scatter each.
    "permute": ((4.0, 1), (4.0, 2)),
    "unpermute": ((4.0, 1), (6.0, 2)),
    # cross-entropy over the logits, softmax in fp32: fused read logits, write fp32 probabilities, read them
    # (10 B); eager logits.float(), log_softmax, nll (14 B).
    "cross_entropy": ((10.0, 3), (14.0, 3)),
}

# One bf16 → fp8 scaled cast, (bytes per element, kernels) as (fused, eager), and the transposed fp8 copy of a
# cast operand that backward's GEMMs read (Hopper's fp8 tensor cores take one operand layout). Fused (Transformer
# Engine's cast_transpose, torch.compile): the amax comes with the producing kernel, the cast reads 2 B and writes
# 1 B, and writes its transpose in the same kernel (1 B more). Eager (torchao Float8Linear, dynamic tensorwise
# scaling): an amax pass (read 2 B), then the scale-and-cast (read 2, write 1); the transpose its own kernel (read 1,
# write 1). Counted from the kernels each runs — estimates, not measurements.
FP8_CAST = ((3.0, 1), (5.0, 2))
FP8_TRANSPOSE = ((1.0, 0), (2.0, 1))


class _Figures(NamedTuple):
    """The DeviceType figures the pricing reads (hashable, so layer times can be memoised by value)."""

    gemm_efficiency: float
    fp8_gemm_efficiency: float
    sm_count: int
    gemm_half_k: float
    attention_efficiency: tuple[float, float]
    fused_attention_efficiency: tuple[float, float]
    memory_bandwidth: float
    memory_efficiency: float
    kernel_gap_s: float
    layer_overhead_s: float
    elementwise: bool


def gemm_efficiency(device: DeviceType, m: float, n: float, k: float) -> float:
    """Fraction of dense peak one (m × k)·(k × n) GEMM reaches on `device`."""
    eff = device.gemm_efficiency
    if device.sm_count:
        tiles_m, tiles_n = math.ceil(m / TILE_M), math.ceil(n / TILE_N)
        tiles = tiles_m * tiles_n
        waves = math.ceil(tiles / device.sm_count)
        eff *= (m * n) / (tiles_m * TILE_M * tiles_n * TILE_N)  # padding of the edge tiles
        eff *= tiles / (waves * device.sm_count)  # the last wave leaves SMs idle
    if device.gemm_half_k:
        eff *= k / (k + device.gemm_half_k)
    return eff


def gemm_time(device: DeviceType, peak: float, m: float, n: float, k: float) -> float:
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    return 2.0 * m * n * k / (peak * gemm_efficiency(device, m, n, k)) + device.kernel_gap_s


def grouped_gemm_time(device: DeviceType, peak: float, groups: float, m: float, n: float, k: float) -> float:
    """`groups` GEMMs of one shape (m × k)·(k × n) in one kernel (a grouped GEMM): tile padding per GEMM, waves
    over all of their tiles, one kernel gap."""
    if groups <= 0 or m <= 0 or n <= 0 or k <= 0:
        return 0.0
    eff = device.gemm_efficiency
    if device.sm_count:
        tiles_m, tiles_n = math.ceil(m / TILE_M), math.ceil(n / TILE_N)
        tiles = groups * tiles_m * tiles_n
        waves = math.ceil(tiles / device.sm_count)
        eff *= (m * n) / (tiles_m * TILE_M * tiles_n * TILE_N)
        eff *= tiles / (waves * device.sm_count)
    if device.gemm_half_k:
        eff *= k / (k + device.gemm_half_k)
    return 2.0 * groups * m * n * k / (peak * eff) + device.kernel_gap_s


def elementwise_time(device: DeviceType, engine: Engine, kind: str, elems: float) -> float:
    """Forward time of one element-wise operator over `elems` elements (16-bit activations)."""
    if not device.elementwise or elems <= 0:
        return 0.0
    per_elem, kernels = ELEMENTWISE[kind][0 if engine.kernels == "fused" else 1]
    return per_elem * elems / (device.memory_bandwidth * device.memory_efficiency) + kernels * device.kernel_gap_s


def fp8_cast_time(device, engine: Engine, m: float, n: float, k: float) -> tuple[float, float]:
    """(forward, backward) seconds of the casts around one fp8 GEMM (m × k)·(k × n): forward casts the input and
    the weight, backward the output gradient and writes the transposed copies of the input and the weight."""
    fused = 0 if engine.kernels == "fused" else 1
    (cast_b, cast_k), (tr_b, tr_k) = FP8_CAST[fused], FP8_TRANSPOSE[fused]
    rate = device.memory_bandwidth * device.memory_efficiency
    fwd = cast_b * (m * k + k * n) / rate + 2 * cast_k * device.kernel_gap_s
    bwd = (cast_b * m * n + tr_b * (m * k + k * n)) / rate + (cast_k + 2 * tr_k) * device.kernel_gap_s
    return fwd, bwd


def _split(op: Gemm, tp: int) -> tuple[float, float]:
    """(k, n) of one tensor-parallel shard of `op`."""
    if op.split == "n":
        return op.k, op.n / tp
    if op.split == "k":
        return op.k / tp, op.n
    return op.k, op.n


def op_times(device: DeviceType, engine: Engine, peak: float, op, samples: float, tp: int, sp: bool,
             act_scale: float, experts: tuple[int, int, float] = (1, 1, 1.0), fp8_peak: float = 0.0
             ) -> tuple[float, float]:
    """(forward, backward) seconds of one operator for `samples` samples on one device of a tp group.

    `experts`: (ep, etp, load-imbalance factor) of the layer's routed experts. `fp8_peak` > 0: GEMMs run in fp8
    at that peak and the device's fp8 GEMM efficiency, with their casts."""
    gemm_device, gemm_peak = (device, peak) if fp8_peak <= 0 else \
        (device._replace(gemm_efficiency=device.fp8_gemm_efficiency), fp8_peak)
    if isinstance(op, GroupedGemm):
        fwd, bwd = grouped_gemm_times(gemm_device, gemm_peak, op, samples, tp, experts)
        if fp8_peak > 0:
            rows, groups, k, n = _grouped_shape(op, samples, tp, experts)
            cast_f, cast_b = fp8_cast_time(device, engine, rows * groups, n, k)
            fwd, bwd = fwd + op.count * cast_f, bwd + op.count * cast_b
        return fwd, bwd
    if isinstance(op, Gemm):
        k, n = _split(op, tp)
        m = op.rows * samples
        fwd = gemm_time(gemm_device, gemm_peak, m, n, k)
        bwd = gemm_time(gemm_device, gemm_peak, m, k, n) + gemm_time(gemm_device, gemm_peak, k, n, m)
        if fp8_peak > 0:
            cast_f, cast_b = fp8_cast_time(device, engine, m, n, k)
            fwd, bwd = fwd + cast_f, bwd + cast_b
        return op.count * fwd, op.count * bwd
    if isinstance(op, Attention):
        return attention_times(device, engine, peak, op, samples, tp, act_scale)
    if isinstance(op, Elementwise):
        elems = op.elems * samples * act_scale / (tp if (op.tp_sharded or sp) else 1)
        fwd = elementwise_time(device, engine, op.kind, elems)
        return fwd, 2.0 * fwd
    raise TypeError(f"unknown operator {op!r}")


def grouped_gemm_times(device: DeviceType, peak: float, op: GroupedGemm, samples: float, tp: int,
                       experts: tuple[int, int, float]) -> tuple[float, float]:
    """The routed experts' GEMMs on one device. The stage's d = dp·tp devices form d/(ep·etp) expert-data-parallel
    groups, each dispatching its share of the micro-batch's tokens (samples·dp·rows·ep·etp/d of them) to the
    experts its ep ranks hold; an expert receives top-k/experts of them (× the imbalance factor at the busiest
    device), and each of its etp ranks multiplies them with its 1/etp slice."""
    rows, groups, k, n = _grouped_shape(op, samples, tp, experts)
    fwd = grouped_gemm_time(device, peak, groups, rows, n, k)
    bwd = grouped_gemm_time(device, peak, groups, rows, k, n) + grouped_gemm_time(device, peak, groups, k, n, rows)
    return op.count * fwd, op.count * bwd


def _grouped_shape(op: GroupedGemm, samples: float, tp: int, experts: tuple[int, int, float]
                   ) -> tuple[float, float, float, float]:
    """(rows per expert, experts on the device, k, n) of the routed experts' GEMMs on one device."""
    ep, etp, imbalance = experts
    rows = samples * op.rows * ep * etp / tp * op.topk / op.experts * imbalance
    k, n = (op.k, op.n / etp) if op.split == "n" else (op.k / etp, op.n) if op.split == "k" else (op.k, op.n)
    return rows, op.experts / ep, k, n


def attention_times(device: DeviceType, engine: Engine, peak: float, op: Attention, samples: float, tp: int,
                    act_scale: float) -> tuple[float, float]:
    batch = samples * op.heads / tp  # independent (sample, head) problems on this device
    value_dim = op.value_dim or op.head_dim
    if engine.flash:  # Q·Kᵀ over head_dim, scores·V over value_dim: 2 FLOPs per multiply-add each
        work = 2.0 * op.queries * op.keys * (op.head_dim + value_dim) * batch * (0.5 if op.causal else 1.0)
        fwd_eff, bwd_eff = device.fused_attention_efficiency if engine.fused_attention else \
            device.attention_efficiency
        return (work / (peak * fwd_eff) + device.kernel_gap_s,
                FLASH_BACKWARD_WORK * work / (peak * bwd_eff) + device.kernel_gap_s)
    rows = op.queries * batch
    scores = gemm_time(device, peak, rows, op.keys, op.head_dim)  # Q·Kᵀ over every (sample, head)
    values = gemm_time(device, peak, rows, value_dim, op.keys)  # softmax(·)·V
    softmax = elementwise_time(device, engine, "softmax", rows * op.keys * act_scale)
    return scores + values + softmax, 2.0 * (scores + values + softmax)


def layer_time(device: DeviceType, engine: Engine, peak: float, layer: LayerSpec, samples: float, tp: int,
               sp: bool, recompute: str, act_scale: float = 1.0, experts: tuple[int, int, float] = (1, 1, 1.0),
               fp8_peak: float = 0.0) -> float:
    """Forward + backward of one layer call for `samples` samples per device (a fraction of a sample under context
    parallelism: each device computes 1/cp of its samples' tokens), plus the forward again of what is recomputed:
    the whole layer ("full"), its attention kernels ("selective"). `act_scale` 2 for fp32 activations (element-wise
    bytes double); `experts` (ep, etp, imbalance) places the routed experts of an MoE layer; `fp8_peak` > 0 runs
    its GEMMs in fp8.

    Memoised on the values it depends on: the planner prices the same (layer, shard) under many pipeline
    configurations."""
    figures = _Figures(*(getattr(device, name) for name in _Figures._fields))
    return _layer_time(figures, engine, peak, layer.ops, layer.flops, samples, tp, sp, recompute, act_scale,
                       experts if layer.experts else (1, 1, 1.0), fp8_peak)


@functools.lru_cache(maxsize=1 << 16)
def _layer_time(device: "_Figures", engine: Engine, peak: float, ops: tuple, flops: float, samples: float, tp: int,
                sp: bool, recompute: str, act_scale: float, experts: tuple[int, int, float], fp8_peak: float) -> float:
    fwd = bwd = attention_fwd = gemm_fwd = elementwise_fwd = 0.0
    for op in ops:
        f, b = op_times(device, engine, peak, op, samples, tp, sp, act_scale, experts, fp8_peak)
        fwd += f
        bwd += b
        if isinstance(op, Attention):
            attention_fwd += f
        elif isinstance(op, (Gemm, GroupedGemm)):
            gemm_fwd += f
        else:
            elementwise_fwd += f
    if not ops and flops > 0:  # a layer described by its FLOPs alone: one large GEMM's rate
        fwd = flops * samples / tp / (peak * device.gemm_efficiency)
        bwd = 2.0 * fwd
    again = {"none": 0.0, "selective": attention_fwd, "selective-op": gemm_fwd / 2 + elementwise_fwd,
             "full": fwd}[recompute]
    return fwd + bwd + again + device.layer_overhead_s * (4.0 / 3.0 if recompute == "full" else 1.0)


def weight_gradient_time(device: DeviceType, peak: float, layer: LayerSpec, samples: float, tp: int,
                         experts: tuple[int, int, float] = (1, 1, 1.0), fp8: bool = False) -> float:
    """Seconds of a layer call's weight-gradient GEMMs (dW = Xᵀ·dY, one of a GEMM's two backward products): what a
    zero-bubble schedule runs apart from the rest of the backward. Attention and element-wise kernels have no
    weight GEMM; their backward is all input gradient. A layer described by its FLOPs alone: one GEMM's worth."""
    device = _Figures(*(getattr(device, name) for name in _Figures._fields))  # what gemm_time reads
    if fp8:
        device = device._replace(gemm_efficiency=device.fp8_gemm_efficiency)
    if not layer.ops:
        return layer.flops * samples / tp / (peak * device.gemm_efficiency) if layer.flops > 0 else 0.0
    total = 0.0
    for op in layer.ops:
        if isinstance(op, GroupedGemm):
            rows, groups, k, n = _grouped_shape(op, samples, tp, experts if layer.experts else (1, 1, 1.0))
            total += op.count * grouped_gemm_time(device, peak, groups, k, n, rows)
        elif isinstance(op, Gemm):
            k, n = _split(op, tp)
            total += op.count * gemm_time(device, peak, k, n, op.rows * samples)
    return total


def attention_seconds(device: DeviceType, engine: Engine, peak: float, layer: LayerSpec, samples: float,
                      tp: int) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's attention kernels alone: what a context-parallel exchange of keys
    and values can hide behind."""
    fwd = bwd = 0.0
    for op in layer.ops:
        if isinstance(op, Attention):
            f, b = attention_times(device, engine, peak, op, samples, tp, 1.0)
            fwd, bwd = fwd + f, bwd + b
    return fwd, bwd


def backward_share(recompute: bool) -> float:
    """Fraction of a layer call's compute that is its backward (what data-parallel reduction overlaps)."""
    return 2.0 / 4.0 if recompute else 2.0 / 3.0


def overlapped(compute: float, comm: float, slowdown: float) -> float:
    """Time of `compute` and `comm` run side by side: the longer one, plus the slowdown the overlapping
    traffic inflicts on compute for as long as both run."""
    return max(compute, comm) + slowdown * min(compute, comm)


def optimizer_time(device: DeviceType, params: float) -> float:
    """Adam step is memory-bound: ~32 B moved per parameter (read 16-bit weight/grad and fp32 master,
    m, v; write them back), at the device's streaming bandwidth."""
    return 32.0 * params / (device.memory_bandwidth * device.memory_efficiency)
