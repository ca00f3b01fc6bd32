"""Moving an activation between adjacent layers whose strategies lay it out differently.

A layer with strategy (dp, cp, tp) on a stage of d = dp·cp·tp ranks sees the micro-batch split into dp
contiguous row blocks; the rank at stage position p holds block p // (cp·tp). Under context parallelism
(cp > 1) the cp ranks of a block, p // tp mod cp, hold its sequence (dim 1) in load-balanced pairs of chunks
(`context_parallel.local_positions`). Without sequence parallelism that part is replicated over the rank's tp
group; with it (`seq`) the tp ranks hold it in tp contiguous slices, rank p the slice p % tp. The same cut
gives the embedding its tokens and the loss its targets (`local_part`).

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

from uniap.runtime.context_parallel import local_positions


@dataclass(frozen=True)
class Layout:
    dp: int  # row blocks of the micro-batch
    tp: int  # ranks per (row block, sequence part)
    seq: bool = False  # the tp ranks hold sequence slices (sequence parallelism), not replicas
    cp: int = 1  # load-balanced sequence parts per row block (context parallelism)

    def block(self, position: int) -> int:
        return position // (self.cp * self.tp)

    def context_rank(self, position: int) -> int:
        return position // self.tp % self.cp

    @property
    def whole(self) -> bool:
        """Every rank holds the whole micro-batch."""
        return self.dp == 1 and self.cp == 1 and not self.seq

    def shape(self, micro_batch: int, seq_len: int) -> tuple[int, int]:
        """(rows, sequence length) of a rank's part."""
        length = seq_len // self.cp
        return micro_batch // self.dp, length // self.tp if self.seq else length


def _gather(x: torch.Tensor, layout: Layout, group, d: int) -> torch.Tensor:
    """All-gather every rank's part over the stage and assemble the whole micro-batch."""
    x = x.contiguous()
    out = torch.empty((d * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x, group=group)
    parts = out.view((d,) + tuple(x.shape))
    tp, cp = layout.tp, layout.cp
    blocks = []
    for c in range(layout.dp):
        ranks = [parts[(c * cp + r) * tp:(c * cp + r + 1) * tp] for r in range(cp)]  # each (tp, rows, t, ...)
        local = [torch.cat(list(tp_parts), dim=1) if layout.seq else tp_parts[0] for tp_parts in ranks]
        blocks.append(local[0] if cp == 1 else _in_sequence_order(torch.cat(local, dim=1), cp))
    return torch.cat(blocks, dim=0)


def _in_sequence_order(parts: torch.Tensor, cp: int) -> torch.Tensor:
    """The cp ranks' parts, concatenated in rank order along dim 1, put back into sequence order."""
    length = parts.shape[1] // cp
    order = torch.cat([local_positions(length, r, cp, parts.device) for r in range(cp)])
    return parts[:, torch.argsort(order)]


def local_part(full: torch.Tensor, layout: Layout, position: int) -> torch.Tensor:
    """The part of the whole micro-batch `full` (rows, sequence, ...) that stage position `position` holds."""
    rows = full.shape[0] // layout.dp
    i = layout.block(position)
    part = full[i * rows:(i + 1) * rows]
    if layout.cp > 1:
        positions = local_positions(full.shape[1] // layout.cp, layout.context_rank(position), layout.cp,
                                    full.device)
        part = part[:, positions]
    if layout.seq:
        length = part.shape[1] // layout.tp
        j = position % layout.tp
        part = part[:, j * length:(j + 1) * length]
    return part.clone()


class _Relayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src: Layout, dst: Layout, position: int, group, d: int):
        ctx.src, ctx.dst, ctx.position, ctx.group, ctx.d = src, dst, position, group, d
        full = x if src.whole else _gather(x, src, group, d)
        return local_part(full, dst, position)

    @staticmethod
    def backward(ctx, grad):
        full = grad if ctx.dst.whole else _gather(grad, ctx.dst, ctx.group, ctx.d)
        return local_part(full, ctx.src, ctx.position), None, None, None, None, None


def relayout(x: torch.Tensor, src: Layout, dst: Layout, position: int, group, d: int) -> torch.Tensor:
    """Re-lay-out the local part `x` from `src` to `dst` (autograd-aware). See the module docstring."""
    if src == dst or (src.whole and dst.whole):
        return x
    return _Relayout.apply(x, src, dst, position, group, d)
