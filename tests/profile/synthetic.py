"""Synthetic profiles: what `uniap profile` would write for a machine that follows a known cost law."""

from __future__ import annotations

from uniap.profile.collect import assemble
from uniap.profile.items import work_items
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy

TINY = ModelConfig(name="tiny-gpt", family="gpt2", layers=4, hidden=128, heads=4, ffn=512, vocab=512, max_seq=64,
                   tied_embeddings=False)
SIZES = [1, 2, 4]


def layer_time(flops: float, s: Strategy, samples: int, *, rate: float, overhead: float) -> float:
    """The synthetic machine: fixed cost per call + forward/backward FLOPs of the shard at `rate`."""
    passes = 4.0 if s.full else 3.0
    return overhead * (1 + 0.5 * (s.dp > 1) + 0.5 * (s.tp > 1)) + passes * flops * samples / s.tp / rate


def synthetic_raw(config: ModelConfig = TINY, seq_len: int = 32, world: int = 4, *, rate: float = 20e9,
                  overhead: float = 2e-3, alpha: float = 1e-4, beta: float = 1e-9, per_slot: float = 0.0,
                  all_reduce: float = 1.0, reps: int = 3) -> dict:
    """`all_reduce`: ZeRO-0's all-reduces beside the backward over the same all-reduces on an idle machine."""
    spec = build_layers(config, seq_len)
    layers, collectives, pipeline = [], [], []
    for item in work_items(config, seq_len, world):
        if item[0] == "layer":
            _, d, lt, s = item
            flops = spec.layers[lt.index].flops
            rows = []
            for n in SIZES:
                t = layer_time(flops, s, n, rate=rate, overhead=overhead)
                rows.append({"samples": n, "fwd_bwd_s": [t] * reps, "fwd_s": [t / 3] * reps,
                             "bwd_s": [2 * t / 3] * reps, "act_bytes": 1000 * n, "inner": 1})
            layers.append({"d": d, "kind": lt.kind, "index": lt.index, "names": list(lt.names),
                           "strategy": s.to_json(), "rows": rows, "optimizer_s": [1e-4] * reps,
                           "static_bytes": 12 * spec.layers[lt.index].params // (s.tp * (s.dp if s.zero else 1))})
        elif item[0] == "collective":
            _, op, n = item
            sizes = [16 << 10, 256 << 10, 1 << 20]
            collectives.append({"op": op, "n": n, "rows": [{"bytes": b, "times_s": [alpha + beta * b] * reps}
                                                            for b in sizes]})
        elif item[0] == "pipeline":
            p = item[1]
            c = 2 * p
            pipeline.append({"stages": p, "micro_batches": c, "samples": 2,
                             "step_s": [(per_slot + 1e-4) * (c + p - 1)] * reps, "stand_in_s": 1e-4})
    whole = {"strategy": {"dp": world, "tp": 1, "zero": 0, "recompute": False, "sp": False}, "samples": 2,
             "chain_s": [1e-2] * reps,
             "synced_s": [1e-2 + all_reduce * sum(alpha + beta * 4 * layer.params for layer in spec.layers)]
             * reps}
    return {"layers": layers, "collectives": collectives, "pipeline": pipeline, "chain": whole,
            "seconds": 1.0, "backend": "gloo", "device_name": "synthetic", "torch": "synthetic"}


def synthetic_profile(config: ModelConfig = TINY, seq_len: int = 32, world: int = 4, *, cores: int | None = None,
                      **kw) -> dict:
    """`cores`: CPU cores the ranks shared (default: as many as ranks, i.e. no sharing)."""
    raw = synthetic_raw(config, seq_len, world, **kw)
    spec = {"micro_batch_sizes": SIZES, "warmup": 1, "reps": 3, "passes": 1, "rep_seconds": 0.05}
    doc = assemble(raw, config, seq_len, world, spec)
    doc["device"]["cores"] = cores or world
    return doc
