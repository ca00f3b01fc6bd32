"""One training job: what `uniap run` asks every rank to do, from the CLI through the launcher to the worker.

Torch-free, so the CLI can build and check it before anything is spawned. Paths are made absolute here,
because the ranks start in another working directory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from uniap.errors import UniapError

OPTIMIZERS = ("sgd", "adamw")
IMPLS = ("uniap", "transformers")


def _absolute(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


@dataclass(frozen=True)
class TrainingJob:
    """Train one plan for a number of steps, optionally checked against one process and checkpointed."""

    plan: str
    """The plan file (made absolute)."""
    steps: int = 3
    """Total steps; a resumed run continues from its checkpoint's step up to this."""
    check: bool = False
    """Also train in one process on rank 0 and report the largest relative loss and parameter differences."""
    data: str | None = None
    """Text file whose bytes are the tokens; None: seeded synthetic tokens."""
    seed: int = 0
    """Seed of the model's initial weights and of the synthetic data."""
    lr: float = 1e-3
    """Learning rate."""
    optimizer: str = "sgd"
    """"sgd" (momentum 0.9) or "adamw"; the check's reference uses the same."""
    checkpoint_dir: str | None = None
    """Folder of `torch.distributed.checkpoint` checkpoints (made absolute)."""
    checkpoint_every: int = 0
    """Save every K steps; 0: never."""
    resume: bool = False
    """Continue from the last complete checkpoint in `checkpoint_dir` (any plan of the same model)."""
    aux_loss_coef: float | None = None
    """Weight of the MoE blocks' load-balancing loss; None: the decoder's default (`models/decoder.AUX_LOSS_COEF`)."""
    impl: str = "uniap"
    """The model trained: "uniap" (our decoder, `models/decoder.py`) or "transformers" (the class the model's
    Hugging Face config names, `runtime/hf.py`)."""
    meter_every_step: bool = False
    """Meter saved activations on every step; by default only the first (warm-up, untimed) step is metered,
    which sees the same shapes, so that the timed steps run without saved-tensor hooks."""

    def __post_init__(self):
        object.__setattr__(self, "plan", _absolute(str(self.plan)))
        object.__setattr__(self, "data", _absolute(self.data))
        object.__setattr__(self, "checkpoint_dir", _absolute(self.checkpoint_dir))
        if self.optimizer not in OPTIMIZERS:
            raise UniapError(f"unknown optimizer {self.optimizer!r} (choose from {', '.join(OPTIMIZERS)})")
        if self.impl not in IMPLS:
            raise UniapError(f"unknown model implementation {self.impl!r} (choose from {', '.join(IMPLS)})")
        if int(self.steps) < 0:
            raise UniapError(f"steps must be >= 0, got {self.steps}")
        if int(self.checkpoint_every) < 0:
            raise UniapError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if (self.checkpoint_every or self.resume) and not self.checkpoint_dir:
            raise UniapError("checkpointing and resume need a checkpoint_dir")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "TrainingJob":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UniapError(f"unknown training-job fields {unknown}")
        return cls(**data)
