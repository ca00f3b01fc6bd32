"""The profile file (schema `uniap.profile/1`): identity, loading, validation and the fitted device figures.

Torch-free: planning with a profile (`uniap plan --profile`) needs no torch.

Document (JSON):
    schema            "uniap.profile/1"
    created           ISO time
    model             {name, fingerprint, seq_len, config}: fingerprint = spec.model.architecture_id of the
                      config and seq_len (a calibration recomputes it from the config: see calibrate)
    world_size        ranks measured (the cluster it calibrates must have as many devices)
    device            {kind cpu|cuda, name, backend gloo|nccl, cores, threads_per_rank}
    torch, precision ("fp32": what the runtime trains), optimizer
    micro_batch_sizes samples per dp shard at which layers were timed
    method            warm-up, repetitions, statistic, timer, concurrency, what each figure includes
    layers            one record per (layer type, strategy): kind, signature (hash of the LayerSpec signature),
                      names, stage_size, strategy, label, runs_as (measured as another strategy, or null),
                      samples, fwd_bwd_s / fwd_s / bwd_s (medians), fit {a, b, r2} (seconds = a + b·samples),
                      act_bytes, act_fit, static_bytes, optimizer_s, spread ((max − min)/median of the reps)
    collectives       one record per (op, n): bytes, median_s, fit {a, b} (seconds = a + b·bytes)
    fitted            {device: {flops_per_s, layer_overhead_s, ...}, link: {latency_s, bandwidth}}:
                      figures for layers and collectives the profile does not hold
"""

from __future__ import annotations

from pathlib import Path

from uniap.errors import UniapError
from uniap.jsonfile import digest
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy

SCHEMA = "uniap.profile/1"


def signature_id(signature: tuple) -> str:
    """Stable short id of a LayerSpec signature (equal signatures: identical layers)."""
    return digest(signature, sort_keys=False)


def load_profile(path: str | Path) -> dict:
    """Read and validate a profile file; one-line UniapError on anything wrong."""
    from uniap.jsonfile import read_json_object

    data = read_json_object(path, "profile")
    validate(data, f"profile {path}")
    return data


def validate(data, where: str = "profile") -> None:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UniapError(f"{where} is not a uniap profile (expected schema {SCHEMA!r}, got {got!r}; write one with "
                         f"`uniap profile`)")
    try:
        int(data["world_size"])
        str(data["model"]["fingerprint"])
        dict(data["model"]["config"])
        int(data["model"]["seq_len"])
        str(data["precision"])
        for rec in data["layers"]:
            str(rec["signature"])
            int(rec["stage_size"])
            dict(rec["strategy"])
            for key in ("fit", "act_fit"):
                float(rec[key]["a"]), float(rec[key]["b"])
            float(rec["static_bytes"]), float(rec["optimizer_s"])
        for rec in data["collectives"]:
            str(rec["op"]), int(rec["n"]), float(rec["fit"]["a"]), float(rec["fit"]["b"])
        dict(data["fitted"]["device"]), dict(data["fitted"]["link"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UniapError(f"{where} is malformed: missing or bad field {exc}") from None
    if int(data["world_size"]) < 1:
        raise UniapError(f"{where} is malformed: world_size must be positive")


def fitted_figures(doc: dict, config: ModelConfig, seq_len: int) -> dict:
    """Device and link figures fitted to the measurements, for layers/collectives the profile lacks.

    device: from the single-rank (d = 1), non-recomputed measurements of each layer type: seconds = a + b·samples
    with a the fixed cost per call (fwd+bwd) and 3·forward FLOPs per sample / b the FLOP rate; the block's
    (the most FLOPs) rate is the device's, its fixed cost the per-layer overhead.
    link: one α–β (ring model) through every collective measurement.
    """
    from uniap.profile import fit
    from uniap.spec.families import build_layers

    layers = build_layers(config, seq_len).layers
    flops = {}
    for layer in layers:
        flops.setdefault(signature_id(layer.signature), layer.flops)
    best = None
    for rec in doc["layers"]:
        if rec["runs_as"] or rec["stage_size"] != 1 or Strategy.from_json(rec["strategy"]).recompute != "none":
            continue
        f = flops.get(rec["signature"], 0.0)
        b, a = float(rec["fit"]["b"]), float(rec["fit"]["a"])
        if f > 0 and b > 0 and (best is None or f > best[0]):
            best = (f, 3.0 * f / b, a)
    device = {"flops_per_s": best[1] if best else None, "layer_overhead_s": best[2] if best else None,
              "source": "single-rank block fit (forward + backward = 3 × forward FLOPs)"}
    points = []
    for rec in doc["collectives"]:
        for nbytes, secs in zip(rec["bytes"], rec["median_s"]):
            points.append((rec["op"], rec["n"], nbytes, secs))
    if points:
        latency, bandwidth = fit.fit_link(points)
    else:
        latency, bandwidth = None, None
    link = {"latency_s": latency, "bandwidth": bandwidth if bandwidth != float("inf") else None,
            "source": "least squares of every collective under the ring model"}
    return {"device": device, "link": link}
