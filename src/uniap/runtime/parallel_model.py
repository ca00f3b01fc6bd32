"""One rank's share of a model laid out as a plan says, and its training step: what `uniap.parallelize` returns and
what `uniap run` trains with.

Every rank builds its stage (its chunks of the chain, each layer under its strategy), the pipeline schedule over
them, and the sums a tied embedding needs; `train_step` then runs one step's forward and backward over the plan's
micro-batches and returns the step's global mean loss, the same on every rank.
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from uniap.errors import UniapError
from uniap.models.decoder import take_aux_losses
from uniap.plans import Plan
from uniap.runtime.checks import RunShape, check_plan
from uniap.runtime.data_parallel import set_backwards_per_step
from uniap.schedules import schedule_named
from uniap.runtime.mesh import Topology, build_topology
from uniap.runtime.parallelize import BuiltStage, build_stage
from uniap.runtime.pipeline import StepRunner


class ParallelModel:
    """This rank's layers of a planned model (`module`) and its training step (`train_step`).

    Build it with `uniap.parallelize` (a `transformers` model) or `ParallelModel.build` (any implementation the
    runtime has); `module` names its parameters as our decoder does (`embed.tok.weight`, `blocks.3.…`, `head.…`),
    and `hf_name` gives a transformers model's own names for them.
    """

    def __init__(self, shape: RunShape, topo: Topology, built: BuiltStage, runner: StepRunner, chain=None):
        self.shape, self.topo, self.built, self.runner, self._chain = shape, topo, built, runner, chain

    @classmethod
    def build(cls, shape: RunShape, rank: int, device: torch.device, seed: int = 0,
              aux_loss_coef: float | None = None, chain=None) -> "ParallelModel":
        """Lay out this rank's stage (collective: every rank calls it). `chain`: a transformers model's chain
        (`hf.HFChain`); None builds our decoder from `seed`."""
        topo = build_topology(shape, rank, device.type)
        built = build_stage(shape, topo, seed, device, aux_loss_coef, chain.layer if chain is not None else None)
        # ZeRO-0 layers all-reduce once per step: from their gradient hooks, or after a zero-bubble step
        split = schedule_named(shape.schedule).split_backward and shape.pp > 1
        set_backwards_per_step(built.module, None if split else shape.micro_batches)
        return cls(shape, topo, built, StepRunner(shape, topo, built, device), chain)

    @property
    def plan(self) -> Plan:
        return self.shape.plan

    @property
    def module(self) -> nn.Module:
        """Every layer this rank holds (all its chunks), under the chain's names."""
        return self.built.module

    def parameters(self):
        return self.built.module.parameters()

    def optimizer(self, kind: str = "adamw", lr: float = 1e-3) -> torch.optim.Optimizer:
        """An optimizer over this rank's shards: "adamw" (betas 0.9/0.999) or "sgd" (momentum 0.9), weight decay
        0, in per-tensor kernels, which take a mix of plain and DTensor parameters."""
        from uniap.runtime.train import make_optimizer

        return make_optimizer(self.parameters(), lr, kind)

    def local_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward and backward of one step; this rank's share of the loss (see `pipeline.make_loss_fn`)."""
        return self.runner.step(tokens, targets)

    def counts_loss(self) -> bool:
        """Whether this rank's loss share counts toward the global loss (one rank per tp group of the head)."""
        return self.topo.stage == self.shape.head_stage and self.topo.position % self.built.out_layout.tp == 0

    def global_loss(self, local: float) -> float:
        """The step's global mean loss (and the MoE blocks' load-balancing losses) from every rank's share."""
        share = torch.tensor([(local if self.counts_loss() else 0.0) + take_aux_losses(self.built.module)],
                             dtype=torch.float64, device=self.runner.device)
        dist.all_reduce(share)
        return float(share.item())

    def train_step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward and backward of one step over the plan's micro-batches; returns the global mean loss on every
        rank. `tokens`, `targets`: the whole global batch (global_batch × seq_len token ids), the same on every
        rank (each takes its rows and sequence chunks). Step the optimizer and zero the gradients after it."""
        expected = (self.shape.global_batch, self.shape.seq_len)
        if tuple(tokens.shape) != expected or tuple(targets.shape) != expected:
            raise UniapError(f"train_step takes the whole global batch of shape {expected}, got "
                             f"{tuple(tokens.shape)} and {tuple(targets.shape)}")
        device = self.runner.device
        return self.global_loss(self.local_step(tokens.to(device), targets.to(device)))

    def hf_name(self, name: str) -> str:
        """A transformers model's own name of one of `module`'s parameters."""
        if self._chain is None:
            raise UniapError("this model is uniap's own decoder: its names are the model's")
        return self._chain.hf_name(name)


def parallelize(model: nn.Module, plan: Plan | str, *, sync_weights: bool = True,
                timeout_s: float = 600.0) -> ParallelModel:
    """Lay out a `transformers` `*ForCausalLM` as `plan` says, on this rank (call it on every rank, inside torchrun;
    the process group is created if there is none). The plan must be for this model's architecture and for the
    world's size; every rank takes rank 0's plan (ranks that planned for themselves may have found different
    plans of equal time). `sync_weights`: first broadcast rank 0's weights, so that every rank starts from the same model.
    Layers the plan cannot be applied to are refused, in one line, before anything is sharded."""
    from uniap.runtime.hf import HFChain
    from uniap.runtime.worker import init_distributed
    from uniap.spec.hf import read_hf_dict

    if isinstance(plan, str):
        plan = Plan.load(plan)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_json_string"):
        raise UniapError(f"parallelize takes a transformers PreTrainedModel, not {type(model).__name__}")
    hf = json.loads(config.to_json_string(use_diff=False))
    ours = read_hf_dict(hf, hf.get("_name_or_path") or type(model).__name__)
    plan.check_matches(ours, int(plan.model.seq_len), plan.world_size)
    ctx = init_distributed(timeout_s)
    plan = _rank0s(plan)
    plan.check_matches(ours, int(plan.model.seq_len), ctx.world)
    shape = check_plan(replace(plan, model=replace(plan.model, hf_config=hf)), ctx.world, "transformers")
    model = model.to(device=ctx.device, dtype=torch.float32)  # fp32 master weights; the plan's precision computes
    if sync_weights:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)
    return ParallelModel.build(shape, ctx.rank, ctx.device, chain=HFChain(model, shape.seq_len))


def _rank0s(plan: Plan) -> Plan:
    box = [plan.to_json() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return Plan.from_json(box[0])
