"""Intra-layer strategies: how one layer runs on the d devices of its pipeline stage."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from uniap.errors import UniapError


@dataclass(frozen=True, order=True)
class Strategy:
    """dp × tp = the stage's device count. tp ranks are contiguous (inside a node first), dp strided.

    zero: 0 replicated (DDP), 1 optimizer states sharded over dp, 2 + gradients, 3 + parameters (FSDP).
    sp: Megatron sequence parallelism (only with tp > 1): tp's all-reduces become reduce-scatter +
    all-gather and the activations tp leaves replicated are sharded too.
    """

    dp: int
    tp: int
    zero: int = 0
    recompute: bool = False
    sp: bool = False

    def __post_init__(self) -> None:
        if self.dp < 1 or self.tp < 1:
            raise UniapError(f"strategy needs dp >= 1 and tp >= 1, got dp={self.dp} tp={self.tp}")
        if self.zero not in (0, 1, 2, 3):
            raise UniapError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero}")
        if self.sp and self.tp == 1:
            raise UniapError("sequence parallelism needs tp > 1")

    @property
    def devices(self) -> int:
        return self.dp * self.tp

    @property
    def layout(self) -> tuple[int, int, bool]:
        """What the activation between layers looks like: batch split dp ways, tp-replicated or sp-split."""
        return (self.dp, self.tp, self.sp)

    def label(self) -> str:
        parts = [f"dp{self.dp}"] if self.dp > 1 else []
        if self.tp > 1:
            parts.append(f"tp{self.tp}" + ("sp" if self.sp else ""))
        if self.dp > 1 and self.zero:
            parts.append(f"z{self.zero}")
        if self.recompute:
            parts.append("rc")
        return "·".join(parts) or "single"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Strategy":
        try:
            return cls(
                dp=int(data["dp"]),
                tp=int(data["tp"]),
                zero=int(data.get("zero", 0)),
                recompute=bool(data.get("recompute", False)),
                sp=bool(data.get("sp", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UniapError(f"malformed strategy {data!r}: {exc}") from None


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def enumerate_strategies(devices: int, max_tp: int | None = None, recompute: bool = True,
                         sequence_parallel: bool = True) -> list[Strategy]:
    """Every strategy for a stage of `devices` devices; tp limited to `max_tp` (default: no limit).

    ZeRO stages only differ when dp > 1, so dp == 1 gets zero=0 alone; sp only exists for tp > 1.
    Divisibility by heads/FFN/vocabulary is per layer and checked by the cost model, not here.
    """
    out = []
    for tp in divisors(devices):
        if max_tp is not None and tp > max_tp:
            continue
        dp = devices // tp
        for zero in (0, 1, 2, 3) if dp > 1 else (0,):
            for rc in (False, True) if recompute else (False,):
                for sp in (False, True) if (tp > 1 and sequence_parallel) else (False,):
                    out.append(Strategy(dp=dp, tp=tp, zero=zero, recompute=rc, sp=sp))
    return out
