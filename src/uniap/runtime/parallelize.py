"""Build this rank's pipeline stage: its slice of the model with each layer's strategy applied.

Per layer, in this order: tensor parallelism over mesh["tp"] (tp > 1), recomputation flag, data
parallelism over mesh["dp"] (dp > 1) with its ZeRO level. Between consecutive layers of the stage,
activations are re-laid out (`relayout.py`); the stage's input arrives in the layout of the
previous stage's last layer (stage 0 gets the whole micro-batch of tokens on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from uniap.models.decoder import DecoderSlice
from uniap.runtime.checks import RunShape
from uniap.runtime.data_parallel import apply_data_parallel
from uniap.runtime.mesh import Topology
from uniap.runtime.relayout import Layout, relayout
from uniap.runtime.tensor_parallel import apply_tensor_parallel


@dataclass
class BuiltStage:
    module: DecoderSlice
    first: int
    last: int
    in_layout: Layout  # layout of the stage input
    out_layout: Layout  # layout of the stage output (its last layer's)


def layer_layout(shape: RunShape, index: int) -> Layout:
    st = shape.strategy(index)
    return Layout(st.dp, st.tp)


def stage_input_layout(shape: RunShape, stage: int) -> Layout:
    if stage == 0:
        return Layout(1, shape.stage_size)  # every rank holds the whole micro-batch of tokens
    return layer_layout(shape, shape.plan.stages[stage - 1].layers[1])


def build_stage(shape: RunShape, topo: Topology, seed: int, device: torch.device) -> BuiltStage:
    first, last = shape.plan.stages[topo.stage].layers
    module = DecoderSlice(shape.config, first, last, seed).to(device)
    for index, layer in module.chain():
        st = shape.strategy(index)
        mesh = topo.mesh(st.dp, st.tp) if st.devices > 1 else None
        if st.tp > 1:
            apply_tensor_parallel(layer, mesh["tp"])
        layer.recompute = bool(st.recompute)
        if st.dp > 1:
            apply_data_parallel(layer, mesh["dp"], st.zero)
    in_layout = stage_input_layout(shape, topo.stage)
    layouts = {index: layer_layout(shape, index) for index in range(first, last + 1)}
    prev = {first: in_layout}
    prev.update({index: layouts[index - 1] for index in range(first + 1, last + 1)})
    d, position, group = shape.stage_size, topo.position, topo.stage_group

    def between(index: int, x: torch.Tensor) -> torch.Tensor:
        return relayout(x, prev[index], layouts[index], position, group, d)

    module.between = between
    return BuiltStage(module=module, first=first, last=last, in_layout=in_layout, out_layout=layouts[last])
