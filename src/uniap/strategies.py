"""Intra-layer strategies: how one layer runs on the d devices of its pipeline stage."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from uniap.errors import UniapError


@dataclass(frozen=True, order=True)
class Strategy:
    """dp × tp = the stage's device count. tp ranks are contiguous (inside a node first), dp strided.

    zero: 0 replicated (DDP), 1 optimizer states sharded over dp, 2 + gradients, 3 + parameters (FSDP).
    sp: Megatron sequence parallelism (only with tp > 1): tp's all-reduces become reduce-scatter +
    all-gather and the activations tp leaves replicated are sharded too.
    ep, etp: the routed experts of an MoE layer (Megatron-Core's "parallel folding"): the same devices
    regrouped as etp contiguous ranks splitting each expert, ep groups of them holding experts/ep experts each,
    and edp = devices / (ep·etp) expert-data-parallel replicas. The attention (and any shared expert) keeps
    dp × tp. Both are 1 on a dense layer.
    """

    dp: int
    tp: int
    zero: int = 0
    recompute: bool = False
    sp: bool = False
    ep: int = 1
    etp: int = 1

    def __post_init__(self) -> None:
        if self.dp < 1 or self.tp < 1:
            raise UniapError(f"strategy needs dp >= 1 and tp >= 1, got dp={self.dp} tp={self.tp}")
        if self.ep < 1 or self.etp < 1:
            raise UniapError(f"strategy needs ep >= 1 and etp >= 1, got ep={self.ep} etp={self.etp}")
        if self.devices % (self.ep * self.etp):
            raise UniapError(f"ep {self.ep} × etp {self.etp} does not divide the {self.devices} devices of "
                             f"dp{self.dp} × tp{self.tp}")
        if self.zero not in (0, 1, 2, 3):
            raise UniapError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero}")
        if self.sp and self.tp == 1:
            raise UniapError("sequence parallelism needs tp > 1")

    @property
    def devices(self) -> int:
        return self.dp * self.tp

    @property
    def edp(self) -> int:
        """Expert-data-parallel replicas: the groups of ep·etp devices that each hold every expert once."""
        return self.devices // (self.ep * self.etp)

    @property
    def moe(self) -> bool:
        """Whether this strategy places routed experts apart from the attention's dp × tp."""
        return self.ep > 1 or self.etp > 1

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
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp > 1:
            parts.append(f"etp{self.etp}")
        if self.recompute:
            parts.append("rc")
        return "·".join(parts) or "single"

    def to_json(self) -> dict:
        """The fields; ep and etp only where they place experts (a dense plan reads as it did before them)."""
        data = asdict(self)
        for name in ("ep", "etp"):
            if data[name] == 1:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Strategy":
        try:
            return cls(
                dp=int(data["dp"]),
                tp=int(data["tp"]),
                zero=int(data.get("zero", 0)),
                recompute=bool(data.get("recompute", False)),
                sp=bool(data.get("sp", False)),
                ep=int(data.get("ep", 1)),
                etp=int(data.get("etp", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UniapError(f"malformed strategy {data!r}: {exc}") from None


def uniform_fallbacks(s: Strategy) -> list[Strategy]:
    """What a uniform configuration (one strategy for every layer, as Megatron-LM and torchtitan take it) runs on
    a layer that cannot take `s`, in order of preference: `s` without recompute (embeddings and heads), without
    its expert layout (dense layers), without both."""
    plain, dense = replace(s, recompute=False), replace(s, ep=1, etp=1)
    return list(dict.fromkeys((s, plain, dense, replace(dense, recompute=False))))


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def enumerate_strategies(devices: int, max_tp: int | None = None, recompute: bool = True,
                         sequence_parallel: bool = True, experts: int = 0,
                         expert_layouts: list[tuple[int, int]] | None = None) -> list[Strategy]:
    """Every strategy for a stage of `devices` devices; tp limited to `max_tp` (default: no limit).

    ZeRO stages only differ when dp > 1, so dp == 1 gets zero=0 alone; sp only exists for tp > 1.
    `experts` > 0 (an MoE model) adds, for each of those, every (ep, etp) of `expert_layouts` (default
    `expert_layouts(devices, experts)`) beyond (1, 1); the cost model allows them on MoE layers only.
    Divisibility by heads/FFN/vocabulary is per layer and checked by the cost model, not here.
    """
    moe = [(1, 1)]
    if experts:
        layouts = expert_layouts_of(devices, experts) if expert_layouts is None else expert_layouts
        moe += [e for e in layouts if e != (1, 1)]
    out = []
    for tp in divisors(devices):
        if max_tp is not None and tp > max_tp:
            continue
        dp = devices // tp
        for zero in (0, 1, 2, 3) if dp > 1 else (0,):
            for rc in (False, True) if recompute else (False,):
                for sp in (False, True) if (tp > 1 and sequence_parallel) else (False,):
                    for ep, etp in moe:
                        out.append(Strategy(dp=dp, tp=tp, zero=zero, recompute=rc, sp=sp, ep=ep, etp=etp))
    return out


def expert_layouts_of(devices: int, experts: int, max_etp: int = 1) -> list[tuple[int, int]]:
    """(ep, etp) pairs a stage of `devices` devices can give `experts` routed experts: ep divides both, etp
    (up to `max_etp`; 1 by default, as DeepSeek-V3 and Qwen3-MoE train) divides what ep leaves."""
    return [(ep, etp) for ep in divisors(devices) if experts % ep == 0
            for etp in divisors(devices // ep) if etp <= max_etp]
