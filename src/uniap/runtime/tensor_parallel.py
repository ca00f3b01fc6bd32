"""Megatron-style tensor parallelism of one chain layer with DTensor `parallelize_module`.

- block: q/k/v column-split (by heads; GQA kv heads split too), o row-split; MLP fc (gate/up)
  column-split, proj (down) row-split. Norms stay replicated plain tensors; a head-wide q/k norm's weight
  gradient is summed over the tp group (each rank applies it to its own heads only). Attention runs on the
  local heads (plain tensors), so no DTensor sharding rule for attention is needed.
- embed: vocabulary-parallel token embedding (rows split, output all-reduced); learned positions
  replicated.
- head: vocabulary-parallel LM projection (columns = vocab split); the logits are all-gathered so
  the loss runs on full logits (replicated over tp). The final norm stays replicated.

Every layer takes and returns plain tensors replicated over its tp group.

Sequence parallelism (Strategy.sp) is executed as plain tensor parallelism: the numerics are
identical; the activation-memory saving and the reduce-scatter/all-gather communication pattern
of Megatron SP are not reproduced.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from uniap.models.decoder import Block, Embed, Head, HeadNorm


def apply_tensor_parallel(layer: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    if isinstance(layer, Block):
        plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
                "attn.o": RowwiseParallel()}
        if layer.mlp.gated:
            plan.update({"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()})
        else:
            plan.update({"mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()})
        for norm in (getattr(layer.attn, "q_norm", None), getattr(layer.attn, "k_norm", None)):
            if isinstance(norm, HeadNorm):  # replicated, applied to local heads: sum its gradient over tp
                norm.tp_group = tp_mesh.get_group()
    elif isinstance(layer, Embed):
        plan = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
    elif isinstance(layer, Head):
        plan = {"lm": ColwiseParallel(output_layouts=Replicate())}
    else:  # pragma: no cover - the chain has only these three kinds
        raise TypeError(f"no tensor-parallel plan for {type(layer).__name__}")
    return parallelize_module(layer, tp_mesh, plan)
