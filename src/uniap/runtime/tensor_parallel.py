"""Megatron-style tensor parallelism of one chain layer with DTensor `parallelize_module`, with or without
sequence parallelism (Strategy.sp, as torchtitan lays it out).

- block: q/k/v column-split (by heads; GQA kv heads split too), o row-split; MLP fc (gate/up)
  column-split, proj (down) row-split. Attention runs on the local heads (plain tensors), so no DTensor
  sharding rule for attention is needed. A head-wide q/k norm stays replicated; its weight gradient is summed
  over the tp group (each rank applies it to its own heads only).
  - tp: norms replicated plain tensors; the block takes and returns plain tensors replicated over tp
    (one all-reduce after attention and one after the MLP, forward; their adjoints backward).
  - tp + sp: the block takes and returns its rank's slice of the sequence (dim 1; the residual stream and
    the norms' inputs are sharded t/tp ways). Norms run under `SequenceParallel` on the local slice;
    attention's and the MLP's inputs are all-gathered over the sequence (`PrepareModuleInput` Shard(1) →
    Replicate; backward: reduce-scatter) and their row-split outputs reduce-scattered back to the sequence
    slice (`RowwiseParallel(output_layouts=Shard(1))`; backward: all-gather): all-gather and reduce-scatter
    replace the all-reduces. The decoder has no dropout; the norms are the only sequence-parallel region.
- embed: vocabulary-parallel token embedding (rows split, output all-reduced); learned positions
  replicated. Its output is replicated over tp also under sp (`relayout.py` takes the sequence slice).
- head: vocabulary-parallel LM projection (columns = vocab split); the logits are all-gathered so
  the loss runs on full logits (replicated over tp). The final norm stays replicated; under sp it runs
  under `SequenceParallel` on the input's sequence slice and the projection all-gathers its input.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from uniap.models.decoder import Block, Embed, Head, HeadNorm

SEQ = Shard(1)  # the sequence dimension of a (batch, sequence, hidden) activation


def _block_plan(layer: Block, sp: bool) -> dict:
    gathered = {"input_layouts": (SEQ,), "desired_input_layouts": (Replicate(),), "use_local_output": True}
    row = RowwiseParallel(output_layouts=SEQ) if sp else RowwiseParallel()
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(), "attn.o": row}
    if layer.mlp.gated:
        plan.update({"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": row})
    else:
        plan.update({"mlp.fc": ColwiseParallel(), "mlp.proj": row})
    if sp:  # every norm sees the sequence slice: its weight gradient is summed over tp by SequenceParallel
        plan.update({n: SequenceParallel() for n in ("norm1", "norm2") if getattr(layer, n) is not None})
        # a post norm's output joins the residual stream, a plain tensor
        plan.update({n: SequenceParallel(use_local_output=True) for n in ("post_norm1", "post_norm2")
                     if getattr(layer, n) is not None})
        plan.update({"attn": PrepareModuleInput(**gathered), "mlp": PrepareModuleInput(**gathered)})
    return plan


def apply_tensor_parallel(layer: nn.Module, tp_mesh: DeviceMesh, sp: bool = False) -> nn.Module:
    if isinstance(layer, Block):
        plan = _block_plan(layer, sp)
        for norm in (getattr(layer.attn, "q_norm", None), getattr(layer.attn, "k_norm", None)):
            if isinstance(norm, HeadNorm):  # replicated, applied to local heads: sum its gradient over tp
                norm.tp_group = tp_mesh.get_group()
    elif isinstance(layer, Embed):
        plan = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
    elif isinstance(layer, Head):
        if sp:
            plan = {"norm": SequenceParallel(), "lm": ColwiseParallel(input_layouts=SEQ, output_layouts=Replicate())}
        else:
            plan = {"lm": ColwiseParallel(output_layouts=Replicate())}
    else:  # pragma: no cover - the chain has only these three kinds
        raise TypeError(f"no tensor-parallel plan for {type(layer).__name__}")
    return parallelize_module(layer, tp_mesh, plan)
