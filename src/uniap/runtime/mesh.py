"""Process groups and device meshes for one plan.

Stage i's ranks r (a tuple from the plan) carry, per strategy used on that stage, a 2-D DeviceMesh
r.reshape(dp·cp, tp) with dims ("dp", "tp") — tp innermost/contiguous, the dp·cp replicas strided (Megatron's
rank order: cp strided by tp, dp by cp·tp): "dp" is the group gradients are reduced and ZeRO shards over, which
under context parallelism spans the cp ranks too. A strategy with cp > 1 also gets its cp groups, the ranks
r.reshape(dp, cp, tp)[i, :, j], over which attention gathers keys and values (`context_parallel.py`). Besides:
one group per stage (all its ranks; used to re-lay-out activations) and, for pipelines, one P2P
group per stage position p = (stage 0's p-th rank, stage 1's p-th rank, ...): activations travel
from a rank to the rank at the same position of the next stage. An MoE block with ep > 1 gets, per (edp, ep)
on its stage, the mesh r.reshape(edp, ep) with dims ("edp", "ep"): ep contiguous (see experts.py).

Creating a group is collective over the whole world, so every rank builds every stage's groups
and meshes, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

if TYPE_CHECKING:  # precision.py, which checks.py imports, builds its groups here
    from uniap.runtime.checks import RunShape


@dataclass
class Topology:
    rank: int
    stage: int  # this rank's stage
    position: int  # this rank's index in its stage's rank list
    ranks: tuple[int, ...]  # this stage's ranks
    stage_group: dist.ProcessGroup | None
    pp_group: dist.ProcessGroup | None  # None when pp == 1
    meshes: dict[tuple[int, int], DeviceMesh] = field(default_factory=dict)  # this stage's (dp·cp, tp) meshes
    expert_meshes: dict[tuple[int, int], DeviceMesh] = field(default_factory=dict)  # its (edp, ep) meshes
    context_groups: dict[tuple[int, int, int], dist.ProcessGroup] = field(default_factory=dict)  # (dp, cp, tp)

    def mesh(self, replicas: int, tp: int) -> DeviceMesh:
        return self.meshes[(replicas, tp)]

    def expert_mesh(self, edp: int, ep: int) -> DeviceMesh:
        return self.expert_meshes[(edp, ep)]

    def context_group(self, dp: int, cp: int, tp: int) -> dist.ProcessGroup:
        return self.context_groups[(dp, cp, tp)]


def new_groups(members: list[list[int]], rank: int) -> dist.ProcessGroup | None:
    """Create a process group for each rank list, in order (collective: every rank creates every group); return
    the one `rank` belongs to (None if none)."""
    mine = None
    for ranks in members:
        group = dist.new_group(sorted(ranks))
        if rank in ranks:
            mine = group
    return mine


def build_topology(shape: RunShape, rank: int, device_type: str) -> Topology:
    plan = shape.plan
    stage, position = shape.stage_of_rank(rank)
    stage_group = new_groups([list(s.ranks) for s in plan.stages], rank)
    pp_group = None
    if shape.pp > 1:
        pp_group = new_groups([[s.ranks[p] for s in plan.stages] for p in range(shape.stage_size)], rank)
    meshes: dict[tuple[int, int], DeviceMesh] = {}
    expert_meshes: dict[tuple[int, int], DeviceMesh] = {}
    context_groups: dict[tuple[int, int, int], dist.ProcessGroup] = {}
    for s in plan.stages:
        strategies = [l.strategy for l in plan.layers if l.stage == s.index]
        for replicas, tp in sorted({(st.replicas, st.tp) for st in strategies}):
            if replicas == 1 and tp == 1:
                continue  # a single-rank stage needs no mesh
            mesh = _mesh(device_type, s.ranks, (replicas, tp), ("dp", "tp"))
            if s.index == stage:
                meshes[(replicas, tp)] = mesh
        for dp, cp, tp in sorted({(st.dp, st.cp, st.tp) for st in strategies if st.cp > 1}):
            grid = torch.tensor(s.ranks).reshape(dp, cp, tp)
            group = new_groups([grid[i, :, j].tolist() for i in range(dp) for j in range(tp)], rank)
            if s.index == stage:
                context_groups[(dp, cp, tp)] = group
        for edp, ep in sorted({(st.edp, st.ep) for st in strategies if st.ep > 1}):
            mesh = _mesh(device_type, s.ranks, (edp, ep), ("edp", "ep"))
            if s.index == stage:
                expert_meshes[(edp, ep)] = mesh
    return Topology(rank=rank, stage=stage, position=position, ranks=plan.stages[stage].ranks,
                    stage_group=stage_group, pp_group=pp_group, meshes=meshes, expert_meshes=expert_meshes,
                    context_groups=context_groups)


def _mesh(device_type: str, ranks: tuple[int, ...], shape: tuple[int, int], names: tuple[str, str]) -> DeviceMesh:
    return DeviceMesh(device_type, torch.tensor(ranks, dtype=torch.int).reshape(shape), mesh_dim_names=names)
