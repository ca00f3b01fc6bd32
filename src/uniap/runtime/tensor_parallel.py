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
    attention's and the MLP's inputs are all-gathered over the sequence once for their column-split
    projections (`gathered_projections`; backward: reduce-scatter) and their row-split outputs
    reduce-scattered back to the sequence slice (`RowwiseParallel(output_layouts=Shard(1))`; backward:
    all-gather): all-gather and reduce-scatter replace the all-reduces. As in Megatron, the projections keep
    only the input's slice for backward and gather it again there (for their weight gradients): what
    sequence parallelism saves is then every tensor the norms' region keeps, the projections' inputs included
    (Korthikanti et al. 2022 §4.2.2), not only the norms' inputs DTensor's `PrepareModuleInput` would leave
    sharded. The decoder has no dropout; the norms are the only sequence-parallel region.
- embed: vocabulary-parallel token embedding (rows split, output all-reduced); learned positions
  replicated. Its output is replicated over tp also under sp (`relayout.py` takes the sequence slice).
- head: vocabulary-parallel LM projection (columns = vocab split); the logits are all-gathered so
  the loss runs on full logits (replicated over tp). The final norm stays replicated; under sp it runs
  under `SequenceParallel` on the input's sequence slice and the projection gathers its input as the
  blocks' do (`gathered_logits`: the slice kept, gathered again in backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from uniap.models.decoder import Block, Embed, Head, HeadNorm, local_tensor

SEQ = Shard(1)  # the sequence dimension of a (batch, sequence, hidden) activation


def _gather_sequence(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return DTensor.from_local(x, mesh, (SEQ,), run_check=False).full_tensor()


def _as_param_grad(grad: torch.Tensor, param: DTensor) -> DTensor:
    return DTensor.from_local(grad, param.device_mesh, param.placements, shape=param.shape, stride=param.stride(),
                              run_check=False)


class _GatheredProjections(torch.autograd.Function):
    """Column-split projections of one input held as sequence slices (Megatron's linear with sequence
    parallelism, `LinearWithGradAccumulationAndAsyncCommunication`). Forward: all-gather the slices once, apply
    every projection to the whole sequence, keep only the slice. Backward: all-gather the slice again for the
    weight gradients; reduce-scatter the input gradient (summed over the projections) back to the slices.
    `x`: the rank's slice, a norm's `SequenceParallel` output (a DTensor) or the plain residual stream."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *params: DTensor | None) -> tuple[torch.Tensor, ...]:
        ctx.save_for_backward(x, *params)
        full = _gather_sequence(local_tensor(x), params[0].device_mesh)
        return tuple(F.linear(full, local_tensor(w), None if b is None else local_tensor(b))
                     for w, b in zip(params[::2], params[1::2]))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        x, *params = ctx.saved_tensors
        mesh = params[0].device_mesh
        # The collectives are asynchronous (waited where their result is first read): as in Megatron, the
        # re-gather runs beside the input-gradient GEMMs and the reduce-scatter beside the weight gradients.
        full = _gather_sequence(local_tensor(x), mesh)
        grads = [g.reshape(-1, g.shape[-1]) for g in grads]
        grad_full = grads[0] @ local_tensor(params[0])
        for grad, w in zip(grads[1:], params[2::2]):
            grad_full = grad_full + grad @ local_tensor(w)
        partial = DTensor.from_local(grad_full.view(full.shape), mesh, (Partial(),), run_check=False)
        grad_x = partial.redistribute(mesh, (SEQ,)).to_local()
        rows = full.reshape(-1, full.shape[-1])
        param_grads = []
        for w, b, grad in zip(params[::2], params[1::2], grads):
            param_grads += [_as_param_grad(grad.t() @ rows, w), None if b is None else _as_param_grad(grad.sum(0), b)]
        if isinstance(x, DTensor):
            grad_x = DTensor.from_local(grad_x, x.device_mesh, x.placements, run_check=False)
        return (grad_x, *param_grads)


def gathered_projections(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """The sequence-parallel `project` of a block's attention and MLP (see the module docstring); the linears are
    `ColwiseParallel` (their weights column-split DTensors; their own forward is not called)."""
    return _GatheredProjections.apply(x, *(t for m in linears for t in (m.weight, m.bias)))


def gathered_logits(x: torch.Tensor, linears: tuple[nn.Linear]) -> tuple[torch.Tensor]:
    """The head's sequence-parallel `project`: `gathered_projections` of the LM projection, whose vocabulary
    shards of the logits are then all-gathered (backward: each rank keeps its shard of the gradient)."""
    (local,) = gathered_projections(x, linears)
    return (DTensor.from_local(local, linears[0].weight.device_mesh, (Shard(-1),), run_check=False).full_tensor(),)


def _block_plan(layer: Block, sp: bool) -> dict:
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
    return plan


def apply_tensor_parallel(layer: nn.Module, tp_mesh: DeviceMesh, sp: bool = False) -> nn.Module:
    if isinstance(layer, Block):
        plan = _block_plan(layer, sp)
        if sp:
            layer.attn.project = layer.mlp.project = gathered_projections
        for norm in (getattr(layer.attn, "q_norm", None), getattr(layer.attn, "k_norm", None)):
            if isinstance(norm, HeadNorm):  # replicated, applied to local heads: sum its gradient over tp
                norm.tp_group = tp_mesh.get_group()
    elif isinstance(layer, Embed):
        plan = {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
    elif isinstance(layer, Head):
        if sp:
            plan = {"norm": SequenceParallel(), "lm": ColwiseParallel()}
            layer.project = gathered_logits
        else:
            plan = {"lm": ColwiseParallel(output_layouts=Replicate())}
    else:  # pragma: no cover - the chain has only these three kinds
        raise TypeError(f"no tensor-parallel plan for {type(layer).__name__}")
    return parallelize_module(layer, tp_mesh, plan)
