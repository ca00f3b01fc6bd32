"""Bytes: model states per parameter (by precision and ZeRO stage) and activations per sample."""

from __future__ import annotations

from uniap.spec.model import LayerSpec
from uniap.spec.ops import Attention, Gemm, GroupedGemm
from uniap.strategies import Strategy

# Model states per parameter, Rajbhandari et al. 2020 (ZeRO, §3.1): mixed-precision Adam keeps a
# 16-bit weight (2 B) and gradient (2 B), plus fp32 master weight, momentum and variance (12 B).
# Pure fp32 Adam keeps weight 4, gradient 4, momentum + variance 8: also 16 B, split differently.
STATE_BYTES = {
    "fp32": (4.0, 4.0, 8.0),
    "fp16": (2.0, 2.0, 12.0),
    "bf16": (2.0, 2.0, 12.0),
    # fp8 GEMMs keep bf16 mixed precision's states (torchao Float8Linear and Transformer Engine cast the 16-bit
    # weight each step; the fp8 copies are transient).
    "fp8": (2.0, 2.0, 12.0),
}


def params_per_device(layer: LayerSpec, s: Strategy) -> float:
    """Parameters one device holds before ZeRO sharding: tp shards its part, ep·etp the routed experts, the
    rest is replicated."""
    return dense_params_per_device(layer, s) + expert_params_per_device(layer, s)


def dense_params_per_device(layer: LayerSpec, s: Strategy) -> float:
    """The parameters that follow the layer's dp × tp (all but the routed experts): ZeRO shards them over dp."""
    return layer.tp_params / s.tp + (layer.params - layer.tp_params - layer.expert_params)


def expert_params_per_device(layer: LayerSpec, s: Strategy) -> float:
    """The routed experts' parameters on one device: experts/ep of them, each split etp ways. ZeRO shards them
    over the expert-data-parallel group (edp replicas), as Megatron-Core's distributed optimizer does."""
    return layer.expert_params / (s.ep * s.etp)


def static_bytes(layer: LayerSpec, s: Strategy, precision: str) -> float:
    """Weights + gradients + optimizer states on one device, after ZeRO sharding over the dp·cp replicas (the routed
    experts: over edp)."""
    return (_states(dense_params_per_device(layer, s), s.replicas, s.zero, precision)
            + _states(expert_params_per_device(layer, s), s.edp, s.zero, precision))


def _states(n: float, replicas: int, zero: int, precision: str) -> float:
    weight, grad, optim = STATE_BYTES[precision]
    if zero >= 1:
        optim /= replicas
    if zero >= 2:
        grad /= replicas
    if zero >= 3:
        weight /= replicas
    return n * (weight + grad + optim)


def activation_bytes_per_sample(layer: LayerSpec, s: Strategy, precision: str, flash_attention: bool,
                                imbalance: float = 1.0) -> float:
    """Activation bytes one device keeps for backward per sample of its dp shard (Korthikanti et al. 2022).

    Without recompute: tp shards `act_tp` (and the scores); `act_other` stays replicated over tp
    unless sequence parallelism shards it too: all of it, the norms' inputs and the column-parallel
    projections' inputs alike, which holds where the projections keep their input's sequence slice and
    gather it again in backward (Megatron; `uniap run`, runtime/tensor_parallel.py), not where they keep the
    gathered input (DTensor's PrepareModuleInput). With full recompute only the layer input is kept
    (sharded over tp by sp). Selective recompute (Korthikanti et al. §5) keeps all but the attention core's
    scores, softmax and dropout (`act_scores`: nothing to drop under flash attention, which never keeps them).
    torchtitan's op policy keeps the layer input, every second GEMM's output (half of the GEMM outputs' bytes)
    and the attention kernel's output and log-sum-exp (`op_policy_bytes`), and recomputes the rest.
    Context parallelism divides all of it by cp: each device keeps the activations of its 1/cp of the tokens
    (the gathered keys and values are transient). The figures in LayerSpec are for 16-bit activations (fp8
    training included: its saved tensors are counted as bf16, an upper bound where an engine saves fp8 copies of
    the GEMM inputs); fp32 doubles them.

    Routed experts: dispatch spreads the stage's routed token copies over its d = dp·tp devices, so per sample
    of the dp shard a device keeps 1/tp of them, × `imbalance` at the busiest device. Expert tensor parallelism
    gives each of its etp ranks the same tokens (their inputs and outputs are kept whole, etp times over the
    group) and 1/etp of each expert's inner activations.
    """
    scale = (2.0 if precision == "fp32" else 1.0) / s.cp
    sp_div = s.tp if s.sp else 1
    if s.full:
        return scale * layer.act_input / sp_div
    if s.recompute == "selective-op":
        return scale * (layer.act_input / sp_div + op_policy_bytes(layer, s, imbalance))
    scores = 0.0 if flash_attention or s.recompute == "selective" else layer.act_scores / s.tp
    routed = (layer.act_routed * s.etp + layer.act_routed_etp) * imbalance / s.tp
    return scale * (layer.act_tp / s.tp + layer.act_other / sp_div + scores + routed)


def op_policy_bytes(layer: LayerSpec, s: Strategy, imbalance: float = 1.0) -> float:
    """Bytes per sample (16-bit) torchtitan's op policy saves beyond the layer input: half of the GEMM outputs
    (every second matmul's) and each attention kernel's output (2 B per element) and log-sum-exp (4 B per query and
    head). Column-parallel outputs and the attention's are split by tp; the others are replicated over tp unless
    sp splits them; routed experts' outputs spread over the stage like their other activations."""
    sp_div = s.tp if s.sp else 1
    gemm_out = 0.0
    for op in layer.ops:
        if isinstance(op, GroupedGemm):
            gemm_out += op.count * op.rows * op.topk * op.n * imbalance / s.tp
        elif isinstance(op, Gemm):
            gemm_out += op.count * op.rows * op.n / (s.tp if op.split == "n" else sp_div)
    attention = sum(op.queries * op.heads / s.tp * (2.0 * (op.value_dim or op.head_dim) + 4.0)
                    for op in layer.ops if isinstance(op, Attention))
    return 2.0 * gemm_out / 2 + attention  # 2 B per output element, half of the outputs kept
