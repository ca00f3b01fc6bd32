"""Bytes: model states per parameter (by precision and ZeRO stage) and activations per sample."""

from __future__ import annotations

from uniap.spec.model import LayerSpec
from uniap.strategies import Strategy

# Model states per parameter, Rajbhandari et al. 2020 (ZeRO, §3.1): mixed-precision Adam keeps a
# 16-bit weight (2 B) and gradient (2 B), plus fp32 master weight, momentum and variance (12 B).
# Pure fp32 Adam keeps weight 4, gradient 4, momentum + variance 8: also 16 B, split differently.
STATE_BYTES = {
    "fp32": (4.0, 4.0, 8.0),
    "fp16": (2.0, 2.0, 12.0),
    "bf16": (2.0, 2.0, 12.0),
}


def params_per_device(layer: LayerSpec, s: Strategy) -> float:
    """Parameters one device holds before ZeRO sharding: tp shards its part, the rest is replicated."""
    return layer.tp_params / s.tp + (layer.params - layer.tp_params)


def static_bytes(layer: LayerSpec, s: Strategy, precision: str) -> float:
    """Weights + gradients + optimizer states on one device, after ZeRO sharding over dp."""
    weight, grad, optim = STATE_BYTES[precision]
    n = params_per_device(layer, s)
    dp = s.dp
    if s.zero >= 1:
        optim /= dp
    if s.zero >= 2:
        grad /= dp
    if s.zero >= 3:
        weight /= dp
    return n * (weight + grad + optim)


def activation_bytes_per_sample(layer: LayerSpec, s: Strategy, precision: str, flash_attention: bool) -> float:
    """Activation bytes one device keeps for backward per sample of its dp shard (Korthikanti et al. 2022).

    Without recompute: tp shards `act_tp` (and the scores); `act_other` stays replicated over tp
    unless sequence parallelism shards it too: all of it, the norms' inputs and the column-parallel
    projections' inputs alike, which holds where the projections keep their input's sequence slice and
    gather it again in backward (Megatron; `uniap run`, runtime/tensor_parallel.py), not where they keep the
    gathered input (DTensor's PrepareModuleInput). With full recompute only the layer input is kept
    (sharded over tp by sp). The figures in LayerSpec are for 16-bit activations; fp32 doubles them.
    """
    scale = 2.0 if precision == "fp32" else 1.0
    sp_div = s.tp if s.sp else 1
    if s.recompute:
        return scale * layer.act_input / sp_div
    scores = 0.0 if flash_attention else layer.act_scores / s.tp
    return scale * (layer.act_tp / s.tp + layer.act_other / sp_div + scores)
