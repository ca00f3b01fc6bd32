"""Moving an activation between adjacent layers whose strategies lay it out differently.

A layer with strategy (dp, tp) on a stage of d = dp·tp ranks sees the micro-batch split into dp
contiguous row blocks; the rank at stage position p holds block p // tp. Without sequence parallelism
the block is replicated over the rank's tp group; with it (`seq`) the tp ranks of a block hold its
sequence (dim 1) in tp contiguous slices, rank p the slice p % tp.

Convention for gradients: the gradient of a tp-replicated activation is held complete and identical
by every replica (DTensor's Replicate semantics — tensor-parallel layers all-reduce their input
gradients), and the gradient of a row block or of a sequence slice is exact for that part.

`relayout(x, src, dst)` moves a local part from layout `src` to `dst`:
  forward:  all-gather the src parts over the stage (skipped when src holds the whole micro-batch on
            every rank: dp == 1 without seq), assemble the micro-batch, keep the dst part;
  backward: the adjoint — all-gather the dst parts' gradients (skipped likewise for dst), keep the
            src part.
Same layout in and out is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Layout:
    dp: int  # row blocks of the micro-batch
    tp: int  # ranks per row block
    seq: bool = False  # the tp ranks of a block hold sequence slices (sequence parallelism), not replicas

    def block(self, position: int) -> int:
        return position // self.tp

    @property
    def whole(self) -> bool:
        """Every rank holds the whole micro-batch."""
        return self.dp == 1 and not self.seq

    def shape(self, micro_batch: int, seq_len: int) -> tuple[int, int]:
        """(rows, sequence length) of a rank's part."""
        return micro_batch // self.dp, seq_len // self.tp if self.seq else seq_len


def _gather(x: torch.Tensor, layout: Layout, group, d: int) -> torch.Tensor:
    """All-gather every rank's part over the stage and assemble the whole micro-batch."""
    x = x.contiguous()
    out = torch.empty((d * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x, group=group)
    parts = out.view((d,) + tuple(x.shape))
    tp = layout.tp
    if layout.seq:
        blocks = [torch.cat([parts[c * tp + j] for j in range(tp)], dim=1) for c in range(layout.dp)]
    else:
        blocks = [parts[c * tp] for c in range(layout.dp)]
    return torch.cat(blocks, dim=0)


def _take(full: torch.Tensor, layout: Layout, position: int) -> torch.Tensor:
    rows = full.shape[0] // layout.dp
    i = layout.block(position)
    part = full[i * rows:(i + 1) * rows]
    if layout.seq:
        length = full.shape[1] // layout.tp
        j = position % layout.tp
        part = part[:, j * length:(j + 1) * length]
    return part.clone()


class _Relayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src: Layout, dst: Layout, position: int, group, d: int):
        ctx.src, ctx.dst, ctx.position, ctx.group, ctx.d = src, dst, position, group, d
        full = x if src.whole else _gather(x, src, group, d)
        return _take(full, dst, position)

    @staticmethod
    def backward(ctx, grad):
        full = grad if ctx.dst.whole else _gather(grad, ctx.dst, ctx.group, ctx.d)
        return _take(full, ctx.src, ctx.position), None, None, None, None, None


def relayout(x: torch.Tensor, src: Layout, dst: Layout, position: int, group, d: int) -> torch.Tensor:
    """Re-lay-out the local part `x` from `src` to `dst` (autograd-aware). See the module docstring."""
    if src == dst or (src.whole and dst.whole):
        return x
    return _Relayout.apply(x, src, dst, position, group, d)
