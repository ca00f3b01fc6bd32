"""Context parallelism (Strategy.cp): each sample's sequence split over the cp ranks of a layer.

Which tokens a rank holds: the sequence is cut into 2·cp equal chunks and cp rank r holds chunks r and
2cp−1−r (Megatron-LM's and Llama 3's load balancing: under a causal mask an early chunk attends to few keys and
a late one to many, so each rank gets one of each and the same attention work). `local_positions` is the one
place this order is written; `relayout.py` cuts and reassembles activations, tokens and targets with it.

Attention is the only operator that mixes tokens; everything else (embedding, norms, MLP, head, loss) runs on
the rank's tokens as they are. Attention all-gathers the keys and values of the other cp ranks (Llama 3's
all-gather CP; `_GatherKeysValues`: backward reduce-scatters their gradients, the sum over every rank's queries
of what each key and value received), keeps its own queries, and masks by global positions: a query at position
i sees the keys at positions j ≤ i (and i − j < window on sliding-window layers). Rotary embeddings and learned
positions take the global positions too, so every token computes what it computes in one process. Gradients are
then reduced over the dp·cp ranks that hold the same parameters (`mesh.py`'s (dp·cp, tp) mesh), each rank's
loss being its tokens' share of the global mean (`pipeline.make_loss_fn`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from uniap.models.decoder import Block, Embed


def local_positions(length: int, rank: int, degree: int, device=None) -> torch.Tensor:
    """Global positions of the `length` tokens cp rank `rank` of `degree` holds: chunks rank and 2·degree−1−rank
    of a sequence of length·degree cut into 2·degree chunks."""
    half = length // 2
    first = torch.arange(rank * half, (rank + 1) * half, device=device)
    second = torch.arange((2 * degree - 1 - rank) * half, (2 * degree - rank) * half, device=device)
    return torch.cat([first, second])


class _GatherKeysValues(torch.autograd.Function):
    """All-gather (B, T/cp, heads, head_dim) keys and values along the sequence over the cp group, in cp-rank
    order, in one collective; backward: reduce-scatter their gradients (summed over the ranks whose queries
    used them)."""

    @staticmethod
    def forward(ctx, k: torch.Tensor, v: torch.Tensor, group, degree: int):
        ctx.group, ctx.degree = group, degree
        both = torch.stack([k, v])  # (2, B, t, heads, head_dim)
        out = torch.empty((degree * 2,) + tuple(both.shape[1:]), dtype=both.dtype, device=both.device)
        dist.all_gather_into_tensor(out, both, group=group)  # gloo wants the ranks' parts along dim 0
        _, b, t = both.shape[:3]
        full = out.view((degree,) + tuple(both.shape)).movedim(0, 2).reshape((2, b, degree * t) +
                                                                             tuple(both.shape[3:]))
        return full[0], full[1]  # the sequence in cp-rank order (`SequenceShard.key_positions`)

    @staticmethod
    def backward(ctx, grad_k: torch.Tensor, grad_v: torch.Tensor):
        degree = ctx.degree
        both = torch.stack([grad_k, grad_v])  # (2, B, cp·t, heads, head_dim)
        _, b, length = both.shape[:3]
        parts = both.reshape((2, b, degree, length // degree) + tuple(both.shape[3:])).movedim(2, 0)
        mine = torch.empty(parts.shape[1:], dtype=parts.dtype, device=parts.device)
        dist.reduce_scatter_tensor(mine, parts.reshape((-1,) + tuple(parts.shape[2:])), group=ctx.group)
        return mine[0], mine[1], None, None


@dataclass(frozen=True)
class SequenceShard:
    """What a layer under context parallelism asks about its sequence (the decoder's `sequence` attribute):
    its tokens' global positions, the gathered keys' positions, and the gathering itself."""

    group: dist.ProcessGroup
    degree: int
    rank: int

    def positions(self, length: int, device) -> torch.Tensor:
        return local_positions(length, self.rank, self.degree, device)

    def key_positions(self, length: int, device) -> torch.Tensor:
        """Positions of the keys `gather` returns, for a local sequence of `length`."""
        return torch.cat([local_positions(length, r, self.degree, device) for r in range(self.degree)])

    def gather(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every cp rank's keys and values, (B, T/cp, heads, head_dim) → (B, T, heads, head_dim)."""
        return _GatherKeysValues.apply(k, v, self.group, self.degree)


def apply_context_parallel(layer: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """Give a block's attention (and an embedding's learned positions) this rank's place in the cp group; the
    head and everything else are token-wise and need nothing."""
    shard = SequenceShard(group, dist.get_world_size(group), dist.get_rank(group))
    if isinstance(layer, Block):
        layer.attn.sequence = shard
    elif isinstance(layer, Embed):
        layer.sequence = shard
    return layer
