"""The CUDA/NCCL branch of the runtime, as far as it can be exercised without a GPU (torch.cuda faked)."""

from __future__ import annotations

import pytest
import torch

from uniap.errors import UniapError
from uniap.runtime import measure
from uniap.runtime.worker import select_device


def _fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_device_and_backend_per_local_rank(monkeypatch):
    _fake_gpus(monkeypatch, 0)
    assert select_device(3) == (torch.device("cpu"), "gloo")
    _fake_gpus(monkeypatch, 8)
    assert select_device(0) == (torch.device("cuda", 0), "nccl")
    assert select_device(7) == (torch.device("cuda", 7), "nccl")
    with pytest.raises(UniapError, match="local rank 8 has no GPU of its own \\(8 visible\\): use --nproc <= 8"):
        select_device(8)


class _FakeEvent:
    """A CUDA event whose elapsed time is read from a script (ms)."""

    clock = [0.0]

    def __init__(self, enable_timing: bool):
        assert enable_timing
        self.at = None

    def record(self):
        _FakeEvent.clock[0] += 2.5  # each recorded interval lasts 2.5 ms of "device time"
        self.at = _FakeEvent.clock[0]

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return end.at - self.at


def test_stage_timer_uses_cuda_events_read_at_the_end_of_the_step(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    device = torch.device("cuda", 1)
    timer = measure.StageTimer(device)
    for _ in range(3):
        with timer.measure():
            pass
    assert not synced  # nothing waits for the device inside the step
    assert timer.take() == pytest.approx(3 * 2.5e-3)
    assert synced == [device] and timer.take() == 0.0


def test_memory_is_the_allocators_high_water_mark_on_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 123_456_789)
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    meter = measure.ActivationMeter(torch.nn.Linear(2, 2))
    meter.peak = 1000
    measure.reset_peak_memory(cuda)
    measure.reset_peak_memory(cpu)
    assert calls == [("reset", cuda)]
    assert measure.peak_memory_bytes(cuda, 50, meter) == 123_456_789
    assert measure.peak_memory_bytes(cpu, 50, meter) == 1050
    assert not measure.meters_activations(cuda) and measure.meters_activations(cpu)


def test_disabled_meter_installs_no_hooks():
    layer = torch.nn.Linear(4, 4)
    meter = measure.ActivationMeter(layer)
    meter.enabled = False
    with meter.forward("k"):
        layer(torch.randn(3, 4, requires_grad=True)).sum().backward()
    assert meter.peak == 0
    meter.enabled = True
    with meter.forward("k"):
        out = layer(torch.randn(3, 4, requires_grad=True)).sum()
    assert meter.peak > 0
    out.backward()


def test_init_distributed_joins_nccl_on_the_local_gpu(monkeypatch):
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from uniap.runtime import worker

    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):  # init_distributed lowers them process-wide
        if hasattr(c10d, name):
            monkeypatch.setattr(c10d, name, getattr(c10d, name))
    _fake_gpus(monkeypatch, 4)
    seen = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: seen.setdefault("set_device", device))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend, **kw))
    monkeypatch.setattr(dist, "get_rank", lambda: 6)
    monkeypatch.setattr(dist, "get_world_size", lambda: 8)
    for var, value in (("RANK", "6"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "2"), ("MASTER_ADDR", "h"),
                       ("MASTER_PORT", "1")):
        monkeypatch.setenv(var, value)
    ctx = worker.init_distributed(30.0)
    assert (ctx.rank, ctx.world, ctx.device) == (6, 8, torch.device("cuda", 2))
    assert seen["backend"] == "nccl" and seen["device_id"] == torch.device("cuda", 2)
    assert seen["set_device"] == torch.device("cuda", 2) and seen["timeout"].total_seconds() == 30.0
