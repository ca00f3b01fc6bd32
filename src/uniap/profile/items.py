"""What `uniap profile` measures, in order (torch-free, so synthetic profiles and planning need no torch).

Every rank builds the same list: the measuring ranks walk it in lock-step.
"""

from __future__ import annotations

from dataclasses import dataclass

from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.strategies import RECOMPUTE_LEVELS, Strategy, divisors


@dataclass(frozen=True)
class LayerType:
    index: int  # chain index of the first layer of this type (the one built and measured)
    kind: str
    names: tuple[str, ...]
    signature: tuple


def layer_types(config: ModelConfig, seq_len: int) -> list[LayerType]:
    """The distinct layers of the chain (by LayerSpec signature), in chain order."""
    spec = build_layers(config, seq_len)
    seen: dict[tuple, list] = {}
    for u, layer in enumerate(spec.layers):
        seen.setdefault(layer.signature, [u, layer.kind, []])[2].append(layer.name)
    return [LayerType(u, kind, tuple(names), sig) for sig, (u, kind, names) in seen.items()]


def runnable(config: ModelConfig, kind: str, s: Strategy) -> bool:
    """What the runtime can run (runtime.checks): tp divides heads/kv heads/FFN (blocks) or the vocabulary
    (embed, head); embed and head are not recomputed."""
    if s.tp > 1:
        sizes = (config.vocab,) if kind in ("embedding", "head") else (config.heads, config.n_kv_heads, config.ffn)
        if any(size % s.tp for size in sizes):
            return False
    return not (s.recompute != "none" and kind in ("embedding", "head"))


def measured_strategies(d: int, kind: str, config: ModelConfig, max_tp: int | None = None) -> list[Strategy]:
    """Strategies measured for a stage of d ranks: ZeRO 0, 2, 3 (1 runs as 2), every recompute level the runtime
    runs (the blocks'; embed and head take none), no sp (runs as tp). A calibrated search takes only what the
    profile holds (`profile.calibration.MeasuredCosts.holds`): a level left unmeasured would be priced by the
    analytic model, which knows nothing of the measured machine, and the solver would pick it for that error."""
    out = []
    for tp in divisors(d):
        if max_tp is not None and tp > max_tp:
            continue
        dp = d // tp
        for zero in ((0, 2, 3) if dp > 1 else (0,)):
            for rc in RECOMPUTE_LEVELS:
                s = Strategy(dp=dp, tp=tp, zero=zero, recompute=rc)
                if runnable(config, kind, s):
                    out.append(s)
    return out


def work_items(config: ModelConfig, seq_len: int, world: int, max_tp: int | None = None) -> list[tuple]:
    """Everything measured, in order, identical on every rank: ("layer", d, LayerType, Strategy), ("chain",),
    ("pipeline", P) and ("collective", op, n)."""
    items: list[tuple] = []
    types = layer_types(config, seq_len)
    for d in sorted(divisors(world), reverse=True):
        for lt in types:
            for s in measured_strategies(d, lt.kind, config, max_tp):
                items.append(("layer", d, lt, s))
    if world > 1:  # the chain prices ZeRO-0's all-reduce beside the backward: nothing to reduce on one rank
        items.append(("chain",))
        items += [("pipeline", p) for p in sorted(divisors(world)) if p > 1]
    for n in sorted(divisors(world)):
        if n > 1:
            items += [("collective", op, n) for op in ("all_reduce", "all_gather", "reduce_scatter")]
    if world > 1:
        items.append(("collective", "p2p", 2))
    return items


def merge_measurements(old: dict, new: dict) -> dict:
    """One item's measurements of two passes together: their repetitions joined, maxima for memory."""
    if "chain_s" in old:  # the whole chain
        return {**old, **{key: list(old[key]) + list(new[key]) for key in ("chain_s", "synced_s")}}
    if "step_s" in old:  # pipeline
        return {**old, "step_s": list(old["step_s"]) + list(new["step_s"]),
                "stand_in_s": min(old["stand_in_s"], new["stand_in_s"])}
    rows = []
    for a, b in zip(old["rows"], new["rows"]):
        row = dict(a)
        for key, value in b.items():
            if key.endswith("_s") or key == "times_s":
                row[key] = list(a[key]) + list(value)
            elif key in ("act_bytes", "inner"):
                row[key] = max(a[key], value)
        rows.append(row)
    out = {**old, "rows": rows}
    if "optimizer_s" in old:
        out["optimizer_s"] = list(old["optimizer_s"]) + list(new["optimizer_s"])
        out["static_bytes"] = max(old["static_bytes"], new["static_bytes"])
    return out
