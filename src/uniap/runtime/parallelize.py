"""Build this rank's pipeline stage: its slice(s) of the model with each layer's strategy applied.

`apply_strategy` is the one place a layer gets its intra-layer strategy, for the runtime and for the
profiler alike: tensor parallelism over mesh["tp"] (tp > 1), then an MoE block's expert parallelism (ep > 1,
`experts.py`), then context parallelism over its cp group (cp > 1, `context_parallel.py`), then the
recomputation level (full: the whole layer checkpointed; selective: a block's attention core; the embedding has
nothing to recompute from and the head has no attention, so selective leaves them as they are), then data
parallelism over mesh["dp"], the dp·cp replicas (dp·cp > 1), with its ZeRO level. Between consecutive layers
of a slice, activations are re-laid out (`relayout.py`; also between layers of different cp); a slice's input
arrives in the layout of the previous chunk's last layer (chunk 0 gets the whole micro-batch of tokens on
every rank, and the embedding takes its rows and sequence chunks from it). Every attention runs the kernel of
the plan's engine (`decoder.use_attention_kernel`). Under the interleaved schedule a rank runs v slices
("chunks"), chunk j of the chain on the stage the schedule places it (`Schedule.chunk_at`: j mod P, or a V).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from uniap.models.decoder import Block, DecoderSlice, configure_aux_losses, use_attention_kernel
from uniap.schedules import schedule_named
from uniap.runtime.checks import RunShape
from uniap.runtime.context_parallel import apply_context_parallel
from uniap.runtime.data_parallel import apply_data_parallel
from uniap.runtime.experts import apply_expert_parallel, expert_parameters
from uniap.runtime.mesh import Topology
from uniap.runtime.precision import FP32, Precision, precision_of, single_rank_mesh
from uniap.runtime.relayout import Layout, relayout
from uniap.runtime.tensor_parallel import apply_tensor_parallel
from uniap.strategies import Strategy


@dataclass
class BuiltChunk:
    module: DecoderSlice
    index: int  # global chunk index (= the stage when there is one chunk per stage)
    first: int
    last: int
    in_layout: Layout  # layout of the chunk input
    out_layout: Layout  # layout of the chunk output (its last layer's)


@dataclass
class BuiltStage:
    module: nn.Module  # every layer this rank holds, named as in the full model (optimizer, checkpoint, check)
    chunks: list[BuiltChunk]  # in order; one unless interleaved

    @property
    def out_layout(self) -> Layout:
        """The layout of this rank's last chunk's output (the head's on the last stage)."""
        return self.chunks[-1].out_layout


class RankLayers(nn.Module):
    """The layers of several chunks under the full model's names (`embed`, `blocks.i`, `head`)."""

    def __init__(self, slices: list[DecoderSlice]):
        super().__init__()
        self.embed = next((s.embed for s in slices if s.embed is not None), None)
        self.blocks = nn.ModuleDict({k: m for s in slices for k, m in s.blocks.items()})
        self.head = next((s.head for s in slices if s.head is not None), None)


def apply_strategy(layer: nn.Module, strategy: Strategy, mesh: DeviceMesh | None,
                   precision: Precision = FP32, *, backward_follows: bool = False,
                   expert_mesh: DeviceMesh | None = None, context_group=None) -> nn.Module:
    """Lay `layer` out as `strategy` says on `mesh` and compute in `precision`; returns the layer (modified in
    place). `mesh`: a ("dp", "tp") mesh of strategy.devices ranks, "dp" the dp·cp replicas; for one rank None in
    fp32, a one-rank ("dp",) mesh in mixed precision (every mixed layer gets FSDP2's casting, see
    `precision.py`). backward_follows: ZeRO-3 keeps the layer's parameters gathered from forward to backward (the
    chain's ends; see `data_parallel.py`). `expert_mesh`: the ("edp", "ep") mesh of an MoE block with ep > 1,
    whose routed experts it spreads (`experts.py`) and leaves out of the dp sync. `context_group`: the cp ranks
    of this rank when cp > 1."""
    if strategy.tp > 1:
        if hasattr(layer, "tensor_parallel"):  # a transformers model's layer (`hf.py`) lays itself out
            layer.tensor_parallel(mesh["tp"], strategy.sp)
        else:
            apply_tensor_parallel(layer, mesh["tp"], sp=strategy.sp)
    if strategy.ep > 1:
        apply_expert_parallel(layer, expert_mesh)
    if strategy.cp > 1:
        apply_context_parallel(layer, context_group)
    layer.recompute = strategy.full
    layer.recompute_ops = strategy.recompute == "selective-op"
    if isinstance(layer, Block):
        layer.attn.recompute_core = strategy.recompute == "selective"
    if strategy.replicas > 1 or precision.mixed:
        apply_data_parallel(layer, mesh["dp"], strategy.zero, precision.policy, backward_follows=backward_follows,
                            apart=expert_parameters(layer) if strategy.ep > 1 else frozenset())
    return layer


def layer_layouts(shape: RunShape, index: int) -> tuple[Layout, Layout]:
    """(input, output) layout of chain layer `index`. Under sequence parallelism a block takes and returns
    sequence slices, the head takes them and returns replicated logits; the embedding's output is replicated
    (see tensor_parallel.py)."""
    st = shape.strategy(index)
    plain = Layout(st.dp, st.tp, cp=st.cp)
    if not st.sp or index == 0:
        return plain, plain
    sliced = Layout(st.dp, st.tp, seq=True, cp=st.cp)
    return (sliced, plain) if index == shape.config.layers + 1 else (sliced, sliced)


def chunk_input_layout(shape: RunShape, chunk: int) -> Layout:
    if chunk == 0:
        return Layout(1, shape.stage_size)  # every rank holds the whole micro-batch of tokens
    return layer_layouts(shape, shape.chunk_range(chunk - 1)[1])[1]


def build_stage(shape: RunShape, topo: Topology, seed: int, device: torch.device,
                aux_loss_coef: float | None = None, layers: Callable[[int], nn.Module] | None = None) -> BuiltStage:
    """`aux_loss_coef`: the MoE blocks' load-balancing weight (None: the decoder's default); their losses are
    means over the global batch's sequences. `layers`: chain layer i of another implementation of the model
    (`hf.HFChain.layer`); None builds our decoder's from `seed`."""
    precision = precision_of(shape.precision)
    one_rank = None
    if precision.mixed and shape.stage_size == 1:  # every rank's layers are single-rank ones
        one_rank = single_rank_mesh(topo.rank, shape.world, device.type)
    placed = schedule_named(shape.schedule)
    chunks = [_build_chunk(shape, topo, seed, device, placed.chunk_at(topo.stage, k, shape.pp), precision, one_rank,
                           aux_loss_coef, layers) for k in range(shape.virtual_stages)]
    module = chunks[0].module if len(chunks) == 1 else RankLayers([c.module for c in chunks])
    return BuiltStage(module=module, chunks=chunks)


def _build_chunk(shape: RunShape, topo: Topology, seed: int, device: torch.device, chunk: int,
                 precision: Precision, one_rank: DeviceMesh | None, aux_loss_coef: float | None,
                 layers: Callable[[int], nn.Module] | None) -> BuiltChunk:
    first, last = shape.chunk_range(chunk)
    module = DecoderSlice(shape.config, first, last, seed, layers).to(device)
    use_attention_kernel(module, shape.attention)
    for index, layer in module.chain():
        st = shape.strategy(index)
        apply_strategy(layer, st, topo.mesh(st.replicas, st.tp) if st.devices > 1 else one_rank, precision,
                       backward_follows=index in (0, shape.config.layers + 1),  # embedding, head
                       expert_mesh=topo.expert_mesh(st.edp, st.ep) if st.ep > 1 else None,
                       context_group=topo.context_group(st.dp, st.cp, st.tp) if st.cp > 1 else None)
    configure_aux_losses(module, aux_loss_coef, shape.global_batch)
    in_layout = chunk_input_layout(shape, chunk)
    layouts = {index: layer_layouts(shape, index) for index in range(first, last + 1)}
    prev = {first: in_layout}
    prev.update({index: layouts[index - 1][1] for index in range(first + 1, last + 1)})
    d, position, group = shape.stage_size, topo.position, topo.stage_group

    def between(index: int, x: torch.Tensor) -> torch.Tensor:
        return relayout(x, prev[index], layouts[index][0], position, group, d)

    module.between = between
    return BuiltChunk(module=module, index=chunk, first=first, last=last, in_layout=in_layout,
                      out_layout=layouts[last][1])
