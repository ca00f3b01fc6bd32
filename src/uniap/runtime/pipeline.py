"""Running one training step's micro-batches through this rank's stage.

pp > 1: `torch.distributed.pipelining` — a `PipelineStage` per rank over its position's P2P group
(stage s, position p sends to stage s+1, position p) with static shapes, driven by `ScheduleGPipe`
or `Schedule1F1B` with the plan's micro-batch count. pp == 1: a plain gradient-accumulation loop
over the micro-batches (the same arithmetic without P2P machinery).

The loss each rank back-propagates is its share of the global mean: the cross-entropy summed over
the tokens of its own rows of the micro-batch, divided by global_batch × seq_len. Summed over the
micro-batches and the head's dp groups this is the global mean loss, so no later scaling is needed
(schedules run with scale_grads=False; data parallelism sums gradients).
"""

from __future__ import annotations

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from uniap.models.decoder import lm_loss
from uniap.runtime.checks import RunShape
from uniap.runtime.measure import ActivationMeter, StageTimer
from uniap.runtime.mesh import Topology
from uniap.runtime.parallelize import BuiltStage


def make_loss_fn(shape: RunShape, built: BuiltStage, position: int):
    """This rank's share of the global mean loss for one micro-batch (`targets`: the whole micro-batch)."""
    head = built.out_layout
    denominator = shape.global_batch * shape.seq_len

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows = targets.shape[0] // head.dp
        i = head.block(position)
        return lm_loss(logits, targets[i * rows:(i + 1) * rows], denominator)

    return loss


class _TimedStage(PipelineStage):
    """A PipelineStage that times its compute and meters saved activations per micro-batch."""

    def __init__(self, *args, timer: StageTimer, meter: ActivationMeter, **kwargs):
        super().__init__(*args, **kwargs)
        self._timer, self._meter = timer, meter

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        with self._timer.measure(), self._meter.forward(fwd_chunk_id):
            return super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        with self._timer.measure():
            out = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                             last_backward=last_backward)
        self._meter.backward_done(bwd_chunk_id)
        self._meter.backward_done(("loss", bwd_chunk_id))
        return out


class StepRunner:
    """`step(tokens, targets)` runs one step's forward+backward; returns this rank's local loss share."""

    def __init__(self, shape: RunShape, topo: Topology, built: BuiltStage, device: torch.device):
        self.shape, self.topo, self.built, self.device = shape, topo, built, device
        self.timer = StageTimer(device)
        self.meter = ActivationMeter(built.module)
        self.loss_fn = make_loss_fn(shape, built, topo.position)
        self._loss_calls = 0
        self.is_first = topo.stage == 0
        self.is_last = topo.stage == shape.pp - 1
        self.schedule = None
        if shape.pp > 1:
            self._build_pipeline()

    def _build_pipeline(self) -> None:
        shape, topo, built = self.shape, self.topo, self.built
        mb, t, h = shape.micro_batch, shape.seq_len, shape.config.hidden
        if self.is_first:
            inputs = torch.zeros((mb, t), dtype=torch.long, device=self.device)
        else:
            inputs = torch.zeros((mb // built.in_layout.dp, t, h), device=self.device, requires_grad=True)
        rows_out = mb // built.out_layout.dp
        width = shape.config.vocab if self.is_last else h
        # Static shapes (no metadata-inference pass); requires_grad marks activations whose gradient
        # travels back between stages.
        outputs = torch.zeros((rows_out, t, width), device=self.device, requires_grad=True)
        stage = _TimedStage(built.module, topo.stage, shape.pp, self.device, input_args=inputs,
                            output_args=outputs, group=topo.pp_group, timer=self.timer, meter=self.meter)
        # Group ranks follow global rank order; stage s sits wherever its rank falls in that order.
        members = [s.ranks[topo.position] for s in shape.plan.stages]
        order = sorted(members)
        stage.stage_index_to_group_rank = {s: order.index(r) for s, r in enumerate(members)}
        cls = ScheduleGPipe if shape.schedule == "gpipe" else Schedule1F1B
        self.schedule = cls(stage, n_microbatches=shape.micro_batches, loss_fn=self._pipeline_loss, scale_grads=False)

    def _pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # The last stage computes micro-batch k's loss right after its forward, in order 0..c-1.
        k, self._loss_calls = self._loss_calls, self._loss_calls + 1
        with self.timer.measure(), self.meter.forward(("loss", k)):
            return self.loss_fn(logits, targets)

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        if self.schedule is None:
            return self._accumulate(tokens, targets)
        losses: list[torch.Tensor] = []
        self._loss_calls = 0
        if self.is_first:
            self.schedule.step(tokens)
        elif self.is_last:
            self.schedule.step(target=targets, losses=losses)
        else:
            self.schedule.step()
        return float(sum(l.detach().float().item() for l in losses)) if self.is_last else 0.0

    def _accumulate(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        total = 0.0
        module = self.built.module
        for k, (x, y) in enumerate(zip(tokens.chunk(self.shape.micro_batches), targets.chunk(self.shape.micro_batches))):
            with self.timer.measure():
                with self.meter.forward(k):
                    loss = self.loss_fn(module(x), y)
                loss.backward()
            self.meter.backward_done(k)
            total += float(loss.detach().item())
        return total
