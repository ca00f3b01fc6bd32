"""What a run measures per rank: compute time of its stage and peak memory.

Time: around each micro-batch's forward, loss and backward of the stage (including the stage's own
tensor/data-parallel collectives, excluding pipeline send/receive waits): wall clock
(`time.perf_counter`) on CPU, CUDA events on the current stream on GPU.

Memory:
- CUDA: `torch.cuda.max_memory_allocated()` (reset at the start of the run).
- CPU: there is no allocator high-water mark, so the figure is an account of tensor bytes:
  static = local parameter + gradient + optimizer-state bytes (shards only, after a step)
  + peak saved activations = the largest total, over the run, of bytes autograd keeps for backward
  for the micro-batches in flight (measured with `torch.autograd.graph.saved_tensors_hooks`,
  deduplicated by storage, parameter storages excluded; a recomputed layer keeps only its input, a block under
  selective recompute its attention core's inputs instead of what the core keeps; a
  collective's output not yet waited on, e.g. a tensor-parallel embedding's all-reduced output that the first
  block's norm keeps, by the buffer it fills). Temporaries inside one operator and communication buffers are not
  counted.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor

from uniap.models.decoder import local_tensor


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    t = local_tensor(t)
    if isinstance(t, AsyncCollectiveTensor):  # its own storage is not readable until waited on; its buffer's is
        t = t.elem
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def tensor_bytes(t: torch.Tensor) -> int:
    loc = local_tensor(t)
    return loc.numel() * loc.element_size()


def static_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    total = 0
    for p in module.parameters():
        total += tensor_bytes(p)
        if p.grad is not None:
            total += tensor_bytes(p.grad)
    if optimizer is not None:
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    total += tensor_bytes(v)
    return total


class ActivationMeter:
    """Peak bytes autograd saves for the micro-batches in flight on this rank.

    `enabled` False turns `forward` into a no-op: the saved-tensor hooks cost time on every operator, so the
    training loop meters only the steps that measure memory.
    """

    def __init__(self, module: nn.Module):
        self.module = module
        self.enabled = True
        self.live: dict[object, int] = {}
        self.current = 0
        self.peak = 0

    def _param_storages(self) -> set[int]:
        out = set()
        for p in self.module.parameters():
            s = _storage(p)
            if s is not None:
                out.add(s[0])
        return out

    @contextmanager
    def forward(self, key: object):
        if not self.enabled:
            yield
            return
        seen: set[int] = set()
        params = self._param_storages()
        total = [0]

        def pack(t: torch.Tensor):
            s = _storage(t)
            if s is not None and s[0] not in seen:
                seen.add(s[0])
                base = t._base if t._base is not None else t  # F.linear saves a transposed view of the weight
                if s[0] not in params and base.is_leaf and base.requires_grad:
                    # Only (a view of) a leaf that requires grad can be a parameter FSDP gathered during this
                    # forward; an activation never is, so it triggers no rescan (rescanning at every activation
                    # cost 16–52 ms per step on 4 CPU ranks).
                    params.update(self._param_storages())
                if s[0] not in params:
                    total[0] += s[1]
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.live[key] = self.live.get(key, 0) + total[0]
        self.current += total[0]
        self.peak = max(self.peak, self.current)

    def backward_done(self, key: object) -> None:
        self.current -= self.live.pop(key, 0)


class StageTimer:
    """Accumulates this rank's stage compute time within a step (CUDA: device events on the current
    stream, read at the end of the step; CPU: wall clock)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.elapsed = 0.0
        self._events: list = []

    @contextmanager
    def measure(self):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            try:
                yield
            finally:
                end.record()
                self._events.append((start, end))
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.elapsed += time.perf_counter() - t0

    def take(self) -> float:
        if self._events:
            torch.cuda.synchronize(self.device)
            self.elapsed += sum(s.elapsed_time(e) for s, e in self._events) / 1000.0
            self._events = []
        out, self.elapsed = self.elapsed, 0.0
        return out


def reset_peak_memory(device: torch.device) -> None:
    """Start the allocator's high-water mark afresh (CUDA; CPU has none)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def meters_activations(device: torch.device) -> bool:
    """Whether the saved-activation account is needed: only where no allocator high-water mark exists (CPU)."""
    return device.type != "cuda"


def peak_memory_bytes(device: torch.device, static_peak: int, meter: ActivationMeter) -> int:
    """This rank's peak memory: the allocator's high-water mark on CUDA, else the account described above."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(static_peak + meter.peak)
