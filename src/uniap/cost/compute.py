"""Compute time of one layer call: FLOPs over peak FLOP/s times an efficiency that grows with size.

Small per-device shards run GEMMs and element-wise kernels far from peak; the saturating curve
eff(F) = e_max · F / (F + F½) captures it with two figures per device type (see spec.cluster),
both calibrated against published end-to-end runs (benchmarks/published_runs.py).
"""

from __future__ import annotations

from uniap.spec.cluster import DeviceType


def efficiency(device: DeviceType, flops_per_call: float) -> float:
    if flops_per_call <= 0:
        return device.gemm_efficiency
    return device.gemm_efficiency * flops_per_call / (flops_per_call + device.half_efficiency_flops)


def fwd_bwd_time(device: DeviceType, peak: float, fwd_flops: float, recompute: bool) -> float:
    """Forward + backward (2× forward) of one layer call, plus one more forward when recomputed."""
    passes = 4.0 if recompute else 3.0
    overhead = device.layer_overhead_s * (passes / 3.0)
    if fwd_flops <= 0:
        return overhead
    return passes * fwd_flops / (peak * efficiency(device, fwd_flops)) + overhead


def optimizer_time(device: DeviceType, params: float) -> float:
    """Adam step is memory-bound: ~32 B moved per parameter (read 16-bit weight/grad and fp32 master,
    m, v; write them back), at the device's memory bandwidth."""
    return 32.0 * params / device.memory_bandwidth
