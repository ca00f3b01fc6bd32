"""Running one training step's micro-batches through this rank's stage.

pp > 1: `torch.distributed.pipelining` — a `PipelineStage` per chunk of the rank (one, or v under the
interleaved schedule) over its position's P2P group (chunk j, position p sends to chunk j+1 on the next
stage, position p) with static shapes, driven by the schedule's torch class (`Schedule.torch_class`:
`ScheduleGPipe`, `Schedule1F1B`, `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`) with the plan's
micro-batch count. pp == 1: a plain gradient-accumulation loop
over the micro-batches (the same arithmetic without P2P machinery).

The loss each rank back-propagates is its share of the global mean: the cross-entropy summed over
the tokens the head holds on it (its rows of the micro-batch; under context parallelism, its chunks of their
sequences), divided by global_batch × seq_len. Summed over the micro-batches and the head's dp·cp groups
this is the global mean loss, so no later scaling is needed (schedules run with scale_grads=False; data
parallelism sums gradients).

A tied embedding's two copies have their gradients summed once the step's backward is done (`tied.py`); then, in
fp16, the gradients are unscaled or the step skipped (`precision.LossScaler`). Activations travel between stages in
the compute dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
from torch.distributed.pipelining import PipelineStage

from uniap.models.decoder import lm_loss
from uniap.runtime.checks import RunShape
from uniap.runtime.measure import ActivationMeter, StageTimer
from uniap.runtime.mesh import Topology
from uniap.runtime.parallelize import BuiltStage
from uniap.runtime.precision import LossScaler, precision_of
from uniap.runtime.data_parallel import finish_gradient_sync, reduce_gradients_now
from uniap.runtime.relayout import local_part
from uniap.runtime.tied import build_tied_gradients
from uniap.schedules import schedule_named


def make_loss_fn(shape: RunShape, built: BuiltStage, position: int, scaler: LossScaler | None = None):
    """This rank's share of the global mean loss for one micro-batch (`targets`: the whole micro-batch), times
    the fp16 loss scale when there is a scaler."""
    head = built.out_layout
    denominator = shape.global_batch * shape.seq_len

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        share = lm_loss(logits, local_part(targets, head, position), denominator)
        return share if scaler is None else share * scaler.scale

    return loss


class _TimedStage(PipelineStage):
    """A PipelineStage that times its compute and meters saved activations per micro-batch."""

    def __init__(self, *args, timer: StageTimer, meter: ActivationMeter, **kwargs):
        super().__init__(*args, **kwargs)
        self._timer, self._meter = timer, meter

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        with self._timer.measure(), self._meter.forward((self.stage_index, fwd_chunk_id)):
            return super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        with self._timer.measure():
            out = super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                             last_backward=last_backward)
        if full_backward:  # an input pass alone keeps the graph for the weight pass
            self._released(bwd_chunk_id)
        return out

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        with self._timer.measure():
            out = super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        self._released(bwd_chunk_id)
        return out

    def _released(self, bwd_chunk_id) -> None:
        self._meter.backward_done((self.stage_index, bwd_chunk_id))
        self._meter.backward_done(("loss", bwd_chunk_id))


class StepRunner:
    """`step(tokens, targets)` runs one step's forward+backward; returns this rank's local loss share."""

    def __init__(self, shape: RunShape, topo: Topology, built: BuiltStage, device: torch.device):
        self.shape, self.topo, self.built, self.device = shape, topo, built, device
        self.timer = StageTimer(device)
        self.meter = ActivationMeter(built.module)
        self.precision = precision_of(shape.precision)
        self.scaler = LossScaler(group=dist.group.WORLD) if self.precision.scales_loss else None
        self.loss_fn = make_loss_fn(shape, built, topo.position, self.scaler)
        self._loss_calls = 0
        self.is_first = topo.stage == 0  # it runs chunk 0, whatever the placement
        self.is_last = topo.stage == shape.head_stage
        self.schedule = None
        self.split_backward = shape.pp > 1 and schedule_named(shape.schedule).split_backward
        if shape.pp > 1:
            self._build_pipeline()
        self.tied = build_tied_gradients(shape, topo, built.module)

    def _build_pipeline(self) -> None:
        shape, topo = self.shape, self.topo
        chunks = shape.pp * shape.virtual_stages
        # Group ranks follow global rank order; chunk j sits wherever its stage's rank falls in that order.
        members = [s.ranks[topo.position] for s in shape.plan.stages]
        order = sorted(members)
        to_group_rank = {j: order.index(members[shape.stage_of_chunk(j)]) for j in range(chunks)}
        stages = []
        for chunk in self.built.chunks:
            stage = _TimedStage(chunk.module, chunk.index, chunks, self.device, input_args=self._static_input(chunk),
                                output_args=self._static_output(chunk, chunks), group=topo.pp_group,
                                timer=self.timer, meter=self.meter)
            stage.stage_index_to_group_rank = to_group_rank
            stages.append(stage)
        chosen = schedule_named(shape.schedule)
        cls = getattr(pipelining, chosen.torch_class)
        self.schedule = cls(stages if chosen.interleaved else stages[0], n_microbatches=shape.micro_batches,
                            loss_fn=self._pipeline_loss, scale_grads=False)

    # Static shapes (no metadata-inference pass); requires_grad marks activations whose gradient travels back
    # between stages.
    def _static_input(self, chunk) -> torch.Tensor:
        mb, t, h = self.shape.micro_batch, self.shape.seq_len, self.shape.config.hidden
        if chunk.index == 0:
            return torch.zeros((mb, t), dtype=torch.long, device=self.device)
        return torch.zeros(chunk.in_layout.shape(mb, t) + (h,), dtype=self.precision.compute_dtype,
                           device=self.device, requires_grad=True)

    def _static_output(self, chunk, chunks: int) -> torch.Tensor:
        mb, t = self.shape.micro_batch, self.shape.seq_len
        width = self.shape.config.vocab if chunk.index == chunks - 1 else self.shape.config.hidden
        return torch.zeros(chunk.out_layout.shape(mb, t) + (width,), dtype=self.precision.compute_dtype,
                           device=self.device, requires_grad=True)

    def _pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # The last stage computes micro-batch k's loss right after its forward, in order 0..c-1.
        k, self._loss_calls = self._loss_calls, self._loss_calls + 1
        with self.timer.measure(), self.meter.forward(("loss", k)):
            return self.loss_fn(logits, targets)

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        scale = 1.0 if self.scaler is None else self.scaler.scale
        local = self._forward_backward(tokens, targets) / scale
        if self.split_backward:  # the weight passes assign gradients: no hook saw them
            reduce_gradients_now(self.built.module)
        else:  # the all-reduces the last backward started ran beside the rest of the step
            finish_gradient_sync(self.built.module)
        if self.tied is not None:
            self.tied.sum()
        if self.scaler is not None:
            self.scaler.unscale_or_skip(self.built.module.parameters())
        return local

    def _forward_backward(self, tokens: torch.Tensor, targets: torch.Tensor) -> float:
        if self.schedule is None:
            return self._accumulate(tokens, targets)
        losses: list[torch.Tensor] = []
        self._loss_calls = 0
        if self.is_first and self.is_last:  # a V: stage 0 runs both ends of the chain
            self.schedule.step(tokens, target=targets, losses=losses)
        elif self.is_first:
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
                with self.meter.forward((0, k)):
                    loss = self.loss_fn(module(x), y)
                loss.backward()
            self.meter.backward_done((0, k))
            total += float(loss.detach().item())
        return total
