"""Process groups and device meshes for one plan.

Stage i's ranks r (a tuple from the plan) carry, per strategy (dp, tp) used on that stage, a 2-D
DeviceMesh r.reshape(dp, tp) with dims ("dp", "tp") — tp innermost/contiguous, dp strided. Besides:
one group per stage (all its ranks; used to re-lay-out activations) and, for pipelines, one P2P
group per stage position p = (stage 0's p-th rank, stage 1's p-th rank, ...): activations travel
from a rank to the rank at the same position of the next stage. An MoE block with ep > 1 gets, per (edp, ep)
on its stage, the mesh r.reshape(edp, ep) with dims ("edp", "ep"): ep contiguous (see experts.py).

Creating a group is collective over the whole world, so every rank builds every stage's groups
and meshes, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from uniap.runtime.checks import RunShape


@dataclass
class Topology:
    rank: int
    stage: int  # this rank's stage
    position: int  # this rank's index in its stage's rank list
    ranks: tuple[int, ...]  # this stage's ranks
    stage_group: dist.ProcessGroup | None
    pp_group: dist.ProcessGroup | None  # None when pp == 1
    meshes: dict[tuple[int, int], DeviceMesh] = field(default_factory=dict)  # this stage's (dp, tp) meshes
    expert_meshes: dict[tuple[int, int], DeviceMesh] = field(default_factory=dict)  # its (edp, ep) meshes

    def mesh(self, dp: int, tp: int) -> DeviceMesh:
        return self.meshes[(dp, tp)]

    def expert_mesh(self, edp: int, ep: int) -> DeviceMesh:
        return self.expert_meshes[(edp, ep)]


def build_topology(shape: RunShape, rank: int, device_type: str) -> Topology:
    plan = shape.plan
    stage, position = shape.stage_of_rank(rank)
    stage_group = None
    for s in plan.stages:
        g = dist.new_group(list(s.ranks))
        if s.index == stage:
            stage_group = g
    pp_group = None
    if shape.pp > 1:
        for p in range(shape.stage_size):
            members = [s.ranks[p] for s in plan.stages]
            g = dist.new_group(members)
            if p == position:
                pp_group = g
    meshes: dict[tuple[int, int], DeviceMesh] = {}
    expert_meshes: dict[tuple[int, int], DeviceMesh] = {}
    for s in plan.stages:
        strategies = [l.strategy for l in plan.layers if l.stage == s.index]
        for dp, tp in sorted({(st.dp, st.tp) for st in strategies}):
            if dp == 1 and tp == 1:
                continue  # a single-rank stage needs no mesh
            mesh = _mesh(device_type, s.ranks, (dp, tp), ("dp", "tp"))
            if s.index == stage:
                meshes[(dp, tp)] = mesh
        for edp, ep in sorted({(st.edp, st.ep) for st in strategies if st.ep > 1}):
            mesh = _mesh(device_type, s.ranks, (edp, ep), ("edp", "ep"))
            if s.index == stage:
                expert_meshes[(edp, ep)] = mesh
    return Topology(rank=rank, stage=stage, position=position, ranks=plan.stages[stage].ranks,
                    stage_group=stage_group, pp_group=pp_group, meshes=meshes, expert_meshes=expert_meshes)


def _mesh(device_type: str, ranks: tuple[int, ...], shape: tuple[int, int], names: tuple[str, str]) -> DeviceMesh:
    return DeviceMesh(device_type, torch.tensor(ranks, dtype=torch.int).reshape(shape), mesh_dim_names=names)
