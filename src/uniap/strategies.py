"""Intra-layer strategies: how one layer runs on the d devices of its pipeline stage."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

from uniap.errors import UniapError

# Activation recomputation of one layer, in order of what backward recomputes: nothing; the attention core
# (scores, softmax, dropout: Korthikanti et al. 2022, Megatron-LM's --recompute-granularity selective); every
# element-wise operator and every second GEMM (torchtitan's selective activation checkpointing, "op" policy);
# the whole layer from its input (full).
RECOMPUTE_LEVELS = ("none", "selective", "selective-op", "full")


@dataclass(frozen=True, order=True)
class Strategy:
    """dp × cp × tp = the stage's device count. tp ranks are contiguous (inside a node first), cp strided by tp,
    dp strided by cp·tp (Megatron-LM's rank order).

    zero: 0 replicated (DDP), 1 optimizer states sharded over dp, 2 + gradients, 3 + parameters (FSDP).
    sp: Megatron sequence parallelism (only with tp > 1): tp's all-reduces become reduce-scatter +
    all-gather and the activations tp leaves replicated are sharded too.
    ep, etp: the routed experts of an MoE layer (Megatron-Core's "parallel folding"): the same devices
    regrouped as etp contiguous ranks splitting each expert, ep groups of them holding experts/ep experts each,
    and edp = devices / (ep·etp) expert-data-parallel replicas. The attention (and any shared expert) keeps
    dp × tp. Both are 1 on a dense layer.
    recompute: one of RECOMPUTE_LEVELS (True and False, as older plans wrote it, read as "full" and "none").
    cp: context parallelism: each sample's sequence split cp ways (load-balanced halves of a causal sequence, as
    Megatron-LM and Llama 3 split it); attention gathers the other ranks' keys and values. Gradients are reduced,
    and ZeRO shards, over the dp·cp ranks that hold the same parameters.
    """

    dp: int
    tp: int
    zero: int = 0
    recompute: str = "none"
    sp: bool = False
    ep: int = 1
    etp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.recompute, bool):
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")
        if self.recompute not in RECOMPUTE_LEVELS:
            raise UniapError(f"unknown recompute level {self.recompute!r} (choose {', '.join(RECOMPUTE_LEVELS)})")
        if self.dp < 1 or self.tp < 1 or self.cp < 1:
            raise UniapError(f"strategy needs dp, tp and cp >= 1, got dp={self.dp} tp={self.tp} cp={self.cp}")
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
        return self.dp * self.cp * self.tp

    @property
    def replicas(self) -> int:
        """Ranks holding the same parameter shard: data-parallel reduction and ZeRO run over dp·cp of them."""
        return self.dp * self.cp

    @property
    def full(self) -> bool:
        """Whether the whole layer is recomputed from its input in backward."""
        return self.recompute == "full"

    @property
    def edp(self) -> int:
        """Expert-data-parallel replicas: the groups of ep·etp devices that each hold every expert once."""
        return self.devices // (self.ep * self.etp)

    @property
    def moe(self) -> bool:
        """Whether this strategy places routed experts apart from the attention's dp × tp."""
        return self.ep > 1 or self.etp > 1

    @property
    def layout(self) -> tuple[int, int, bool, int]:
        """What the activation between layers looks like: batch split dp ways, sequence cp ways, tp-replicated or
        sp-split."""
        return (self.dp, self.tp, self.sp, self.cp)

    def label(self) -> str:
        parts = [f"dp{self.dp}"] if self.dp > 1 else []
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.tp > 1:
            parts.append(f"tp{self.tp}" + ("sp" if self.sp else ""))
        if self.replicas > 1 and self.zero:
            parts.append(f"z{self.zero}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp > 1:
            parts.append(f"etp{self.etp}")
        if self.recompute != "none":
            parts.append({"selective": "sel", "selective-op": "selop", "full": "rc"}[self.recompute])
        return "·".join(parts) or "single"

    def to_json(self) -> dict:
        """The fields; ep, etp and cp only where they are not 1 (a plan without them reads as it did before)."""
        data = asdict(self)
        for name in ("ep", "etp", "cp"):
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
                recompute=_recompute_of(data.get("recompute", "none")),
                sp=bool(data.get("sp", False)),
                ep=int(data.get("ep", 1)),
                etp=int(data.get("etp", 1)),
                cp=int(data.get("cp", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UniapError(f"malformed strategy {data!r}: {exc}") from None


def _recompute_of(value) -> str:
    """A plan's recompute field: a level's name, or a bool as plans before the levels wrote it."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str):
        return value
    raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_LEVELS)}")


def uniform_fallbacks(s: Strategy) -> list[Strategy]:
    """What a uniform configuration (one strategy for every layer, as Megatron-LM and torchtitan take it) runs on
    a layer that cannot take `s`, in order of preference: `s` without recompute (embeddings and heads), without
    its expert layout (dense layers), without both."""
    plain, dense = replace(s, recompute="none"), replace(s, ep=1, etp=1)
    return list(dict.fromkeys((s, plain, dense, replace(dense, recompute="none"))))


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def enumerate_strategies(devices: int, max_tp: int | None = None, recompute: bool | tuple[str, ...] = True,
                         sequence_parallel: bool = True, experts: int = 0,
                         expert_layouts: list[tuple[int, int]] | None = None,
                         context: tuple[int, ...] = (1,)) -> list[Strategy]:
    """Every strategy for a stage of `devices` devices; tp limited to `max_tp` (default: no limit).

    ZeRO stages only differ when dp·cp > 1, so a single replica gets zero=0 alone; sp only exists for tp > 1.
    `recompute`: the levels to enumerate (True: all of RECOMPUTE_LEVELS, False: none only). `context`: the cp
    degrees to try (`context_degrees` says which are worth it for a sequence length); each must divide what tp
    leaves.
    `experts` > 0 (an MoE model) adds, for each of those, every (ep, etp) of `expert_layouts` (default
    `expert_layouts(devices, experts)`) beyond (1, 1); the cost model allows them on MoE layers only.
    Divisibility by heads/FFN/vocabulary is per layer and checked by the cost model, not here.
    """
    levels = recompute if isinstance(recompute, bool) else tuple(recompute)
    layouts = None if expert_layouts is None else tuple(map(tuple, expert_layouts))
    return list(_strategies(devices, max_tp, levels, sequence_parallel, experts, layouts, tuple(context)))


@functools.lru_cache(maxsize=256)
def _strategies(devices: int, max_tp: int | None, recompute: bool | tuple[str, ...], sequence_parallel: bool,
                experts: int, expert_layouts: tuple[tuple[int, int], ...] | None,
                context: tuple[int, ...]) -> tuple[Strategy, ...]:
    """`enumerate_strategies`, kept per argument (a search asks again for every pipeline configuration)."""
    moe = [(1, 1)]
    if experts:
        layouts = expert_layouts_of(devices, experts) if expert_layouts is None else expert_layouts
        moe += [e for e in layouts if e != (1, 1)]
    levels = RECOMPUTE_LEVELS if recompute is True else ("none",) if recompute is False else recompute
    out = []
    for tp in divisors(devices):
        if max_tp is not None and tp > max_tp:
            continue
        for cp in context:
            if (devices // tp) % cp:
                continue
            dp = devices // (tp * cp)
            for zero in (0, 1, 2, 3) if dp * cp > 1 else (0,):
                for rc in levels:
                    for sp in (False, True) if (tp > 1 and sequence_parallel) else (False,):
                        for ep, etp in moe:
                            out.append(Strategy(dp=dp, tp=tp, zero=zero, recompute=rc, sp=sp, ep=ep, etp=etp, cp=cp))
    return tuple(out)


# Context parallelism is searched where each rank keeps at least this many tokens of a sequence: below it the
# ring's key/value exchange (∝ s/cp per step) outlasts the attention it hides behind (∝ (s/cp)² per step), and
# tp or dp do the same job cheaper. NVIDIA's tuned H100 recipes split 8K sequences in two (Llama 3.1 70B and 405B,
# cp 2), so 4K-token chunks can pay. A pruning rule of the search (an estimate), not of the cost model:
# `estimate --cp` prices any degree.
CP_MIN_TOKENS = 4096


def context_degrees(devices: int, seq_len: int) -> tuple[int, ...]:
    """The cp degrees the search tries on stages of `devices` devices for sequences of `seq_len` tokens."""
    return tuple(cp for cp in divisors(devices) if cp == 1 or (seq_len % (2 * cp) == 0
                                                                and seq_len // cp >= CP_MIN_TOKENS))


def expert_layouts_of(devices: int, experts: int, max_etp: int = 1) -> list[tuple[int, int]]:
    """(ep, etp) pairs a stage of `devices` devices can give `experts` routed experts: ep divides both, etp
    (up to `max_etp`; 1 by default, as DeepSeek-V3 and Qwen3-MoE train) divides what ep leaves."""
    return [(ep, etp) for ep in divisors(devices) if experts % ep == 0
            for etp in divisors(devices // ep) if etp <= max_etp]
