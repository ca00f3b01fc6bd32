"""What one training iteration processes."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from uniap.errors import UniapError

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
# fp8 is a choice, never a default: it changes numerics (the GEMMs' inputs are scaled to 8 bits).
DEFAULT_PRECISIONS = ("fp32", "fp16", "bf16")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
INTERLEAVED = "interleaved-1f1b"


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


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise UniapError(f"unknown schedule {schedule!r} (choose {', '.join(SCHEDULES)})")
    return schedule


def check_interleaving(stages: int, micro_batches: int, virtual_stages: int) -> None:
    """The interleaved schedule's conditions: at least two device groups, and whole rounds of P micro-batches
    (Megatron-LM's requirement; it also meets torch's ScheduleInterleaved1F1B, which needs c divisible by its
    number of rounds max(1, c // P)). With fewer micro-batches than groups the pipeline never fills and the
    interleaved bubble formula does not hold."""
    if virtual_stages < 2:
        raise UniapError(f"the interleaved schedule needs at least 2 virtual stages, got {virtual_stages}")
    if stages < 2:
        raise UniapError("the interleaved schedule needs a pipeline of at least 2 stages")
    if micro_batches % stages:
        raise UniapError(f"the interleaved schedule needs the micro-batch count ({micro_batches}) to be a multiple "
                         f"of the pipeline degree ({stages})")


def interleaved_order(stage: int, stages: int, micro_batches: int, virtual_stages: int) -> list[tuple[str, int, int]]:
    """The operations stage `stage` runs under interleaved 1F1B, in order: ("F"|"B", global chunk, micro-batch).
    Forwards go round by round (P micro-batches) through its chunks 0..v−1, backwards through v−1..0; after
    min(c·v, (v − 1)·P + 2·(P − 1 − stage)) warm-up forwards they alternate (torch `_get_warmup_ops`, as
    Megatron-LM)."""
    P, c, v = stages, micro_batches, virtual_stages
    rounds = [range(r * P, min((r + 1) * P, c)) for r in range(-(-c // P))]
    forwards = [("F", k * P + stage, m) for ms in rounds for k in range(v) for m in ms]
    backwards = [("B", k * P + stage, m) for ms in rounds for k in reversed(range(v)) for m in ms]
    warm = min(c * v, (v - 1) * P + 2 * (P - 1 - stage))
    ops = forwards[:warm]
    for f, b in zip(forwards[warm:], backwards):
        ops += [f, b]
    return ops + backwards[len(forwards) - warm:]


def inflight(schedule: str, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[float]:
    """Micro-batches whose activations stage i (0-based) holds at its peak; per chunk for interleaved 1F1B.

    GPipe runs every forward before any backward: all c are alive. 1F1B (PipeDream-flush) lets
    stage i start backward after P − i forwards, so it holds min(c, P − i). Interleaved 1F1B: what each chunk
    holds when its stage's first backward starts (`interleaved_order`: the first chunks fill first). That is one
    moment of the schedule, so its memory never exceeds the peak (the solver's bounds use it); the peak itself is
    the largest of the stage's `held_patterns`.
    """
    check_schedule(schedule)
    if schedule == "gpipe":
        return [micro_batches] * stages
    if schedule == "1f1b":
        return [min(micro_batches, stages - i) for i in range(stages)]
    v = virtual_stages
    out = [0.0] * (stages * v)
    for d in range(stages):
        first_backward = _held_over_time(d, stages, min(micro_batches, 4 * stages), v)[-1]  # as _undominated
        for k in range(v):
            out[k * stages + d] = float(first_backward[k])
    return out


def held_patterns(stages: int, micro_batches: int, virtual_stages: int) -> list[list[list[int]]]:
    """Per stage of an interleaved 1F1B pipeline: the micro-batches each of its v chunks holds at once, at every
    moment no other moment dominates (a chunk's activations live from its forward to its backward). The stage's
    peak memory is the largest of Σ_k held_k · (chunk k's activation bytes) over these: exact whatever the chunks'
    sizes, where one count per chunk is exact only for chunks of equal activations."""
    # After the warm-up both the forward and the backward stream cycle through the chunks with a period of P·v
    # micro-batch chunks, so what a stage holds repeats, and the drain only releases: four rounds of P
    # micro-batches (a prefix of the order for any c) pass through every moment no later one exceeds.
    rounds = min(micro_batches, 4 * stages)
    return [[list(m) for m in _undominated(d, stages, rounds, virtual_stages)] for d in range(stages)]


@functools.lru_cache(maxsize=4096)
def _undominated(stage: int, stages: int, micro_batches: int, virtual_stages: int) -> tuple[tuple[int, ...], ...]:
    """The stage's occupancy vectors that no other one covers (each candidate of a search asks again: cached)."""
    moments = np.unique(np.array(_held_over_time(stage, stages, micro_batches, virtual_stages, every=True)), axis=0)
    covered = np.zeros(len(moments), dtype=bool)
    for lo in range(0, len(moments), 256):  # the vectors are distinct: one ≥ another covers it
        block = moments[lo:lo + 256]
        above = (moments[None, :, :] >= block[:, None, :]).all(axis=2)  # [i, j]: moments[j] ≥ block[i]
        covered[lo:lo + 256] = above.sum(axis=1) > 1  # itself, and another
    return tuple(tuple(int(x) for x in m) for m in moments[~covered])


@functools.lru_cache(maxsize=4096)
def _held_over_time(stage: int, stages: int, micro_batches: int, virtual_stages: int,
                    every: bool = False) -> tuple[tuple[int, ...], ...]:
    """Chunk occupancy of `stage` after each of its forwards up to its first backward (every: after every op)."""
    held = [0] * virtual_stages
    states = []
    for kind, chunk, _ in interleaved_order(stage, stages, micro_batches, virtual_stages):
        if kind == "B" and not every:
            break
        held[chunk // stages] += 1 if kind == "F" else -1
        states.append(tuple(held))
    return tuple(states)
