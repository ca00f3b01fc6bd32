"""Moving an activation between adjacent layers whose strategies lay it out differently.

A layer with strategy (dp, tp) on a stage of d = dp·tp ranks sees the micro-batch split into dp
contiguous row blocks; the rank at stage position p holds block p // tp, replicated over its tp
group (sequence parallelism is run as plain tp, so the sequence is never split here).

Convention for gradients: the gradient of a tp-replicated activation is held complete and identical
by every replica (DTensor's Replicate semantics — tensor-parallel layers all-reduce their input
gradients), and the gradient of a row block is exact for that block.

`relayout(x, src, dst)` moves a local block from layout `src` to `dst`:
  forward:  all-gather the src blocks over the stage (skipped when src.dp == 1: every rank already
            holds the whole micro-batch), keep the dst block;
  backward: the adjoint — all-gather the dst blocks' gradients (skipped when dst.dp == 1), keep the
            src block's rows.
Same layout in and out is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int

    def block(self, position: int) -> int:
        return position // self.tp


def _gather_blocks(x: torch.Tensor, layout: Layout, group, d: int) -> torch.Tensor:
    """All-gather every rank's block over the stage and assemble the whole micro-batch."""
    x = x.contiguous()
    out = torch.empty((d * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x, group=group)
    parts = out.view((d,) + tuple(x.shape))
    return torch.cat([parts[c * layout.tp] for c in range(layout.dp)], dim=0)


def _take_block(full: torch.Tensor, layout: Layout, position: int) -> torch.Tensor:
    rows = full.shape[0] // layout.dp
    i = layout.block(position)
    return full[i * rows:(i + 1) * rows].clone()


class _Relayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src: Layout, dst: Layout, position: int, group, d: int):
        ctx.src, ctx.dst, ctx.position, ctx.group, ctx.d = src, dst, position, group, d
        full = x if src.dp == 1 else _gather_blocks(x, src, group, d)
        return _take_block(full, dst, position)

    @staticmethod
    def backward(ctx, grad):
        full = grad if ctx.dst.dp == 1 else _gather_blocks(grad, ctx.dst, ctx.group, ctx.d)
        return _take_block(full, ctx.src, ctx.position), None, None, None, None, None


def relayout(x: torch.Tensor, src: Layout, dst: Layout, position: int, group, d: int) -> torch.Tensor:
    """Re-lay-out the local block `x` from `src` to `dst` (autograd-aware). See the module docstring."""
    if src.dp == dst.dp:
        return x
    return _Relayout.apply(x, src, dst, position, group, d)
