"""Tied embeddings: the embedding and the LM head train one weight, held as two copies.

The embedding (chain layer 0, on stage 0) and the head (the last layer, on the last stage) each keep their own
copy of the V×h matrix, laid out by the layer's own strategy and initialised equal (`models/decoder.py`). After
every backward each copy's gradient is replaced by the sum of the two — what autograd gives one shared
parameter — so both copies take the same optimizer step and stay equal, as Megatron does for a first and a last
pipeline stage.

- Both layers on this rank's stage (pp == 1): the sum is formed on the rank.
- On different stages: the rank at position p of the first stage and the rank at position p of the last stage
  form a pair group and all-reduce.
- When the two layers have the same (dp·cp, tp, zero), the rank at position p holds the same rows of both copies
  (tensor and data parallelism both shard the vocabulary dimension), so the local shards are summed directly.
  Otherwise each copy's gradient is gathered to the full matrix over its layer's mesh, the full matrices are
  summed, and every copy keeps its own shard of the sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from uniap.runtime.checks import RunShape
from uniap.runtime.mesh import Topology, new_groups


def _layout_key(shape: RunShape, index: int) -> tuple[int, int, int]:
    st = shape.strategy(index)
    return st.replicas, st.tp, st.zero  # the (dp·cp, tp) mesh and ZeRO level that shard the weight


class TiedGradients:
    """Sums the two copies' gradients of a tied embedding (see the module docstring)."""

    def __init__(self, copies: list[torch.nn.Parameter], pair: dist.ProcessGroup | None, same_layout: bool):
        self.copies = copies  # this rank's copies: the embedding's and/or the head's
        self.pair = pair  # None when both copies sit on this rank
        self.same_layout = same_layout

    @torch.no_grad()
    def sum(self) -> None:
        for w in self.copies:  # a DTensor gradient may come back laid out unlike its parameter (an embedding's
            g = w.grad  # is replicated over tp): lay it out as the parameter, which the optimizer needs anyway
            if isinstance(g, DTensor) and g.placements != w.placements:
                w.grad = g.redistribute(w.device_mesh, w.placements)
        grads = [w.grad for w in self.copies]
        if self.same_layout:
            local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
            if self.pair is None:
                total = local[0] + local[1]
                for part in local:
                    part.copy_(total)
            else:
                dist.all_reduce(local[0], group=self.pair)
            return
        full = [g.full_tensor() if isinstance(g, DTensor) else g.clone() for g in grads]
        total = full[0] + full[1] if self.pair is None else full[0]
        if self.pair is not None:
            dist.all_reduce(total, group=self.pair)
        for g in grads:
            if isinstance(g, DTensor):
                g.to_local().copy_(distribute_tensor(total, g.device_mesh, g.placements, src_data_rank=None).to_local())
            else:
                g.copy_(total)


def build_tied_gradients(shape: RunShape, topo: Topology, module: torch.nn.Module) -> TiedGradients | None:
    """The gradient sum for this rank, or None when the model does not tie its embeddings or this rank holds
    neither copy. Collective over the world when pp > 1 (every rank creates every pair group)."""
    if not shape.config.tied_embeddings:
        return None
    pair = None
    if shape.pp > 1 and shape.head_stage != 0:  # a V holds both copies on stage 0: summed there
        first, last = shape.plan.stages[0].ranks, shape.plan.stages[shape.head_stage].ranks
        pair = new_groups([[first[p], last[p]] for p in range(shape.stage_size)], topo.rank)
    copies = []
    if getattr(module, "embed", None) is not None:
        copies.append(module.embed.tok.weight)
    if getattr(module, "head", None) is not None:
        copies.append(module.head.lm.weight)
    if not copies:
        return None
    same = _layout_key(shape, 0) == _layout_key(shape, shape.config.layers + 1)
    return TiedGradients(copies, pair if len(copies) == 1 else None, same)
