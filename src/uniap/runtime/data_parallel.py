"""Data parallelism of one chain layer over its dp mesh, by ZeRO level.

Mapping (FSDP2 family, composable, parameter names unchanged):
- ZeRO-0 → `replicate` (FSDP2-family DDP): parameters, gradients and optimizer state replicated;
  gradients all-reduced.
- ZeRO-1 and ZeRO-2 → `fully_shard(reshard_after_forward=False)`: parameters are gathered once in
  forward and kept until backward ends; gradients are reduce-scattered and optimizer state lives on
  the shard (ZeRO-2; FSDP2 offers no all-reduce-then-shard-the-optimizer mode, so ZeRO-1 runs as
  ZeRO-2 — same numerics, ZeRO-2's memory).
- ZeRO-3 → `fully_shard(reshard_after_forward=True)`: parameters are re-gathered in backward.

Gradient reduction is a plain SUM with divide factor 1: each rank's loss is its share of the global
mean (see `train.py`), so summing over dp gives the exact gradient whatever dp each layer uses.
gloo has no PREMUL_SUM/AVG reduce ops, hence `set_force_sum_reduction_for_comms(True)`.
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def apply_data_parallel(layer: nn.Module, dp_mesh: DeviceMesh, zero: int,
                        mp_policy: MixedPrecisionPolicy | None = None) -> nn.Module:
    """`mp_policy`: FSDP2's mixed precision (see `precision.py`); None computes in fp32."""
    policy = {} if mp_policy is None else {"mp_policy": mp_policy}
    if zero == 0:
        module = replicate(layer, mesh=dp_mesh, **policy)
    else:
        module = fully_shard(layer, mesh=dp_mesh, reshard_after_forward=(zero == 3), **policy)
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)
    return module
