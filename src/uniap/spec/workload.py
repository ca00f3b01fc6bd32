"""What one training iteration processes."""

from __future__ import annotations

from dataclasses import dataclass

from uniap.errors import UniapError

PRECISIONS = ("fp32", "fp16", "bf16")
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Workload:
    global_batch: int  # samples per iteration (all data-parallel replicas, all micro-batches)
    seq_len: int
    precision: str = "bf16"  # fp32, or mixed precision fp16/bf16 with fp32 master weights

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise UniapError(f"global batch must be >= 1, got {self.global_batch}")
        if self.seq_len < 1:
            raise UniapError(f"sequence length must be >= 1, got {self.seq_len}")
        if self.precision not in PRECISIONS:
            raise UniapError(f"unknown precision {self.precision!r} (choose {', '.join(PRECISIONS)})")

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element: 16-bit under mixed precision, 4 in fp32."""
        return 4 if self.precision == "fp32" else 2

    def to_json(self) -> dict:
        return {"global_batch": self.global_batch, "seq_len": self.seq_len, "precision": self.precision}


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise UniapError(f"unknown schedule {schedule!r} (choose gpipe or 1f1b)")
    return schedule


def inflight(schedule: str, stages: int, micro_batches: int) -> list[int]:
    """Micro-batches whose activations stage i (0-based) holds at its peak.

    GPipe runs every forward before any backward: all c are alive. 1F1B (PipeDream-flush) lets
    stage i start backward after P − i forwards, so it holds min(c, P − i).
    """
    check_schedule(schedule)
    if schedule == "gpipe":
        return [micro_batches] * stages
    return [min(micro_batches, stages - i) for i in range(stages)]
