"""What one training iteration processes."""

from __future__ import annotations

from dataclasses import dataclass

from uniap.errors import UniapError

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
# fp8 is a choice, never a default: it changes numerics (the GEMMs' inputs are scaled to 8 bits).
DEFAULT_PRECISIONS = ("fp32", "fp16", "bf16")


# Load imbalance of dropless MoE training: tokens the busiest expert-parallel rank receives over the mean.
# A guess until fitted (docs/cost-model.md, "Mixtures of experts"): balanced routing is 1.0.
EXPERT_IMBALANCE = 1.1


@dataclass(frozen=True)
class Workload:
    global_batch: int  # samples per iteration (all data-parallel replicas, all micro-batches)
    seq_len: int
    precision: str = "bf16"  # fp32; mixed precision fp16/bf16 with fp32 master weights; fp8: bf16 with the blocks'
    # GEMMs in fp8 (torchao Float8Linear, Transformer Engine): master weights, optimizer and activations as bf16
    expert_imbalance: float = EXPERT_IMBALANCE  # MoE: tokens at the busiest expert-parallel rank / the mean

    def __post_init__(self) -> None:
        if not 1.0 <= self.expert_imbalance <= 64.0:
            raise UniapError(f"expert imbalance must be in [1, 64] (busiest rank's tokens / the mean), "
                             f"got {self.expert_imbalance}")
        if self.global_batch < 1:
            raise UniapError(f"global batch must be >= 1, got {self.global_batch}")
        if self.seq_len < 1:
            raise UniapError(f"sequence length must be >= 1, got {self.seq_len}")
        if self.precision not in PRECISIONS:
            raise UniapError(f"unknown precision {self.precision!r} (choose {', '.join(PRECISIONS)})")

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element: 16-bit under mixed precision (fp8 included: the tensors between operators
        stay bf16), 4 in fp32."""
        return 4 if self.precision == "fp32" else 2

    def to_json(self) -> dict:
        return {"global_batch": self.global_batch, "seq_len": self.seq_len, "precision": self.precision,
                "expert_imbalance": self.expert_imbalance}
