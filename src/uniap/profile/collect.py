"""`uniap profile`'s driver: spawn the measuring ranks (torchrun), show progress, assemble the profile file.

    profile_model(config, seq_len, nproc=4, micro_batch_sizes=(1, 2, 4), reps=5) -> profile dict
    profiling = Profiling(config, seq_len, nproc=4); profiling.measure(1); profiling.measure(1)  # in two launches

The profile (schema `uniap.profile/1`, see `uniap.profile.schema`) keeps, for every figure, how it was
measured (warm-up, repetitions, statistic) and the medians it was fitted to.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from uniap.errors import UniapError
from uniap.profile import fit
from uniap.profile.items import merge_measurements
from uniap.profile.schema import SCHEMA, signature_id
from uniap.runtime.launcher import Nodes, launch
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig, architecture_id
from uniap.strategies import Strategy

MAX_NPROC = 64


def default_nproc() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:  # pragma: no cover - torch is required to profile anyway
        pass
    return 4


def check_request(config: ModelConfig, seq_len: int, nproc: int, micro_batch_sizes, reps: int, warmup: int) -> None:
    import torch

    from uniap.models.decoder import check_supported

    check_supported(config)
    build_layers(config, seq_len)  # raises on a bad sequence length
    if nproc < 1 or nproc > MAX_NPROC:
        raise UniapError(f"--nproc must be between 1 and {MAX_NPROC}, got {nproc}")
    if not micro_batch_sizes or any(int(m) < 1 for m in micro_batch_sizes):
        raise UniapError(f"micro-batch sizes must be positive integers, got {list(micro_batch_sizes)}")
    if len(set(micro_batch_sizes)) < 2:
        raise UniapError("give at least two different micro-batch sizes (a line t = t0 + t1·samples is fitted)")
    if reps < 1 or warmup < 0:
        raise UniapError(f"--reps must be >= 1 and --warmup >= 0 (got {reps}, {warmup})")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise UniapError(f"--nproc {nproc} but only {torch.cuda.device_count()} GPUs are visible (one rank per GPU)")


class Profiling:
    """One profile request measured in one or more launches of the ranks, each adding passes to the same
    figures (their repetitions joined, as passes within a launch are). `uniap demo` interleaves the launches
    with its training runs, so that the profile and the runs see the same spells of a shared machine."""

    def __init__(self, config: ModelConfig, seq_len: int, nproc: int | None = None, *, micro_batch_sizes=(1, 2, 4),
                 reps: int = 5, warmup: int = 2, timeout_s: float = 120.0, max_tp: int | None = None,
                 collective_sizes: list[int] | None = None, seed: int = 0, rep_seconds: float = 0.05):
        self.config, self.seq_len = config, int(seq_len)
        self.nproc = default_nproc() if nproc is None else int(nproc)
        sizes = sorted({int(m) for m in micro_batch_sizes})
        check_request(config, seq_len, self.nproc, sizes, reps, warmup)
        self.spec = {"config": config.to_json(), "seq_len": self.seq_len, "micro_batch_sizes": sizes,
                     "reps": int(reps), "warmup": int(warmup), "timeout_s": float(timeout_s), "max_tp": max_tp,
                     "seed": int(seed), "collective_sizes": collective_sizes, "rep_seconds": float(rep_seconds)}
        self.raw: dict | None = None  # rank 0's measurements of every launch so far
        self.passes = 0
        self.wall_s = 0.0

    def measure(self, passes: int = 1, progress=None) -> dict:
        """Launch the ranks for `passes` more passes; the profile document of every pass so far.

        progress(done, total, what) is called from this process while the ranks measure."""
        if passes < 1:
            raise UniapError(f"--passes must be >= 1, got {passes}")
        started = time.perf_counter()
        raw = _spawn({**self.spec, "passes": int(passes)}, self.nproc, self.spec["timeout_s"], progress)
        self.raw = raw if self.raw is None else merge_raw(self.raw, raw)
        self.passes += int(passes)
        self.wall_s += time.perf_counter() - started
        return assemble(self.raw, self.config, self.seq_len, self.nproc, {**self.spec, "passes": self.passes},
                        wall_s=self.wall_s)


def profile_model(config: ModelConfig, seq_len: int, nproc: int | None = None, *, passes: int = 1, progress=None,
                  **request) -> dict:
    """Measure `config` at `seq_len` on `nproc` local ranks in one launch of `passes` passes; return the profile
    document. `request`: the measuring options of `Profiling`."""
    return Profiling(config, seq_len, nproc, **request).measure(passes, progress)


def measure_in_launches(config: ModelConfig, seq_len: int, nproc: int | None, launches: int, *, progress=None,
                        **request) -> dict:
    """`uniap profile --passes N`: one pass in each of `launches` launches of the ranks, merged (`merge_raw`) as
    `uniap demo` merges its passes; the profile document of them all. Each launch starts fresh processes (thread
    placement, allocator, warm caches), so its pass samples what a later run starts with, not only the seconds
    after the previous pass."""
    profiling = Profiling(config, seq_len, nproc, **request)  # the request checked first
    if int(launches) < 1:
        raise UniapError(f"--passes must be >= 1, got {launches}")
    doc = None
    for i in range(int(launches)):
        step = None if progress is None else (
            lambda done, total, what, i=i: progress(done, total, f"{what} (launch {i + 1}/{launches})"))
        doc = profiling.measure(1, step)
    return doc


def merge_raw(old: dict, new: dict) -> dict:
    """Rank 0's raw measurements of two launches of the same request as one (`items.merge_measurements` per
    item, in the order both walked them)."""
    out = dict(new)
    for key in ("layers", "collectives", "pipeline"):
        if len(old[key]) != len(new[key]):
            raise UniapError(f"profile launches measured different {key} ({len(old[key])} and {len(new[key])} "
                             "items): were they asked the same?")
        out[key] = [merge_measurements(a, b) for a, b in zip(old[key], new[key])]
    if old.get("chain") and new.get("chain"):
        out["chain"] = merge_measurements(old["chain"], new["chain"])
    out["seconds"] = float(old.get("seconds", 0.0)) + float(new.get("seconds", 0.0))
    return out


def _spawn(spec: dict, nproc: int, timeout_s: float, progress) -> dict:
    wall = float(timeout_s) * 20 + 600.0  # collectives time out after timeout_s; this only guards the launcher
    on_poll = None if progress is None else (lambda out: _report(out, progress))
    return launch(["-m", "uniap.profile.worker"], spec, Nodes(nproc), wall_s=wall, what="profile", on_poll=on_poll,
                  timeout_s=timeout_s)


def _report(out: Path, progress) -> None:
    try:
        state = json.loads((out / "progress.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    progress(int(state["done"]), int(state["total"]), str(state["what"]))


def assemble(raw: dict, config: ModelConfig, seq_len: int, world: int, spec: dict, wall_s: float = 0.0) -> dict:
    """The profile document from rank 0's raw measurements: medians, fits and how they were measured."""
    spec_model = build_layers(config, seq_len)
    by_index = {u: layer for u, layer in enumerate(spec_model.layers)}
    layers = []
    for entry in raw["layers"]:
        s = Strategy.from_json(entry["strategy"])
        lspec = by_index[int(entry["index"])]
        samples = [row["samples"] for row in entry["rows"]]
        total = [fit.median(row["fwd_bwd_s"]) for row in entry["rows"]]
        fwd = [fit.median(row["fwd_s"]) for row in entry["rows"]]
        bwd = [fit.median(row["bwd_s"]) for row in entry["rows"]]
        act = [int(row["act_bytes"]) for row in entry["rows"]]
        record = {
            "kind": entry["kind"], "signature": signature_id(lspec.signature), "names": entry["names"],
            "stage_size": int(entry["d"]), "strategy": s.to_json(), "label": s.label(), "runs_as": None,
            "samples": samples, "fwd_bwd_s": total, "fwd_s": fwd, "bwd_s": bwd,
            "fit": fit.fit_line(samples, total).to_json(),
            "act_bytes": act, "act_fit": fit.fit_line(samples, act).to_json(),
            "static_bytes": int(entry["static_bytes"]),
            "optimizer_s": fit.median(entry["optimizer_s"]) if entry["optimizer_s"] else 0.0,
            "spread": [_spread(row["fwd_bwd_s"]) for row in entry["rows"]],
            "calls_per_rep": [int(row.get("inner", 1)) for row in entry["rows"]],
            **_repetitions([row["fwd_bwd_s"] for row in entry["rows"]], spec),
        }
        layers.append(record)
        for alias in _aliases(s):
            layers.append({**record, "strategy": alias.to_json(), "label": alias.label(), "runs_as": s.label()})
    collectives = []
    for entry in raw["collectives"]:
        sizes = [row["bytes"] for row in entry["rows"]]
        med = [fit.median(row["times_s"]) for row in entry["rows"]]
        collectives.append({"op": entry["op"], "n": int(entry["n"]), "bytes": sizes, "median_s": med,
                            "fit": fit.fit_line(sizes, med).to_json(),
                            "spread": [_spread(row["times_s"]) for row in entry["rows"]],
                            **_repetitions([row["times_s"] for row in entry["rows"]], spec)})
    pipeline = []
    for e in raw.get("pipeline", []):
        step = fit.median(e["step_s"])
        slots = e["micro_batches"] + e["stages"] - 1
        pipeline.append({"stages": int(e["stages"]), "micro_batches": int(e["micro_batches"]),
                         "samples": int(e["samples"]), "step_s": step, "stand_in_s": float(e["stand_in_s"]),
                         "per_slot_s": max(step / slots - float(e["stand_in_s"]), 0.0)})
    chain = None
    if raw.get("chain"):
        e = raw["chain"]
        fits = {(c["op"], c["n"]): c["fit"] for c in collectives}
        line = fits.get(("all_reduce", world))
        idle = sum(line["a"] + line["b"] * 4.0 * layer.params for layer in spec_model.layers) if line else 0.0
        # repetition by repetition (the two were timed back to back in each): the median difference
        added = max(fit.median([y - w for w, y in zip(e["chain_s"], e["synced_s"])]), 0.0)
        chain = {"strategy": e["strategy"], "samples": int(e["samples"]), "chain_s": fit.median(e["chain_s"]),
                 "synced_s": fit.median(e["synced_s"]), "all_reduce_idle_s": idle,
                 "all_reduce_scale": added / idle if idle > 0 else 1.0, "repetitions": len(e["chain_s"])}
    cuda = raw.get("backend") == "nccl"
    doc = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": {"name": config.name, "fingerprint": architecture_id(config, seq_len), "seq_len": int(seq_len),
                  "config": config.to_json()},
        "world_size": int(world),
        "device": {"kind": "cuda" if cuda else "cpu", "name": raw.get("device_name", ""),
                   "backend": raw.get("backend", ""), "cores": os.cpu_count(),
                   "threads_per_rank": raw.get("threads"), "omp_num_threads": raw.get("omp_num_threads")},
        "torch": raw.get("torch", ""),
        "precision": "fp32",
        "optimizer": "sgd (momentum 0.9)",
        "micro_batch_sizes": list(spec["micro_batch_sizes"]),
        "method": _method(spec, cuda),
        "layers": layers,
        "collectives": collectives,
        "pipeline": pipeline,
        "chain": chain,
        "measure_seconds": float(raw.get("seconds", 0.0)),
        "wall_seconds": float(wall_s),
    }
    from uniap.profile.schema import fitted_figures

    doc["fitted"] = fitted_figures(doc, config, seq_len)
    return doc


def _method(spec: dict, cuda: bool) -> dict:
    """How a profile's figures were measured, in words (the file says it of itself)."""
    return {
        "warmup": int(spec["warmup"]), "reps": int(spec["reps"]), "passes": int(spec.get("passes", 1)),
        "repetition": f"calls back to back until a repetition lasts about {spec.get('rep_seconds', 0.05)} s; "
                      "figure = repetition time / calls",
        "statistic": "median over repetitions (of every pass) of the slowest rank's time",
        "timer": "CUDA events" if cuda else "time.perf_counter (wall clock)",
        "concurrency": "all ranks busy: the world is cut into groups of stage size d and every group "
                       "measures the same layer and strategy at the same time",
        "layer_time": "forward + backward of one layer call, without the activation meter, with its tp "
                      "collectives and, for ZeRO 1-3, its dp gradient reduce-scatter (the runtime's FSDP2 "
                      "reduces every micro-batch); ZeRO-0's all-reduce, once per step in the runtime, is "
                      "not in it (calibration prices it from the all-reduce fit); fit: seconds = a + "
                      "b·samples (samples per dp shard)",
        "memory": ("static: parameters + gradients + optimizer state (local shards) after a step; "
                   "activations: bytes saved for backward per micro-batch (saved-tensor hooks"
                   + (", or the allocator's growth across the forward if larger)" if cuda else ")")),
        "collectives": "all groups of n ranks at once; fit: seconds = a + b·bytes",
        "chain": "forward + backward of the whole chain at once, every layer dp over all ranks (ZeRO-0), "
                 "without its all-reduces and, back to back in every repetition, with them as a step runs "
                 "them (synced); all_reduce_scale = median over repetitions of (synced − chain) / the "
                 "all-reduce fit's time for the same gradients on an idle machine, on every ZeRO-0 "
                 "all-reduce; chain_s and synced_s are their medians",
        "pipeline": "torch.distributed.pipelining 1F1B over P stages, c = 2P micro-batches of the model's "
                    "activation, with a stand-in stage that computes almost nothing: per_slot_s = step / "
                    "(c + P − 1) − the stand-in's forward + backward",
    }


def _aliases(s: Strategy) -> list[Strategy]:
    """Strategies the runtime runs exactly like the measured one: ZeRO-1 as ZeRO-2, sp as plain tp."""
    out = []
    if s.dp > 1 and s.zero == 2:
        out.append(Strategy(s.dp, s.tp, 1, s.recompute))
    if s.tp > 1:
        out += [Strategy(x.dp, x.tp, x.zero, x.recompute, sp=True) for x in [s] + out]
    return out


def _spread(values) -> float:
    """(max − min) / median of the repetitions: how noisy the figure was."""
    med = fit.median(values)
    return float((max(values) - min(values)) / med) if med > 0 else 0.0


def _repetitions(rows: list[list[float]], spec: dict) -> dict:
    """Per measured point (micro-batch size or message size): every repetition (`reps_s`, pass after pass),
    the median of each pass (`pass_median_s`) and the spread of those medians across passes (`pass_spread`,
    (max − min) / median; 0 for one pass). What `uniap.profile.uncertainty` derives intervals from."""
    reps = max(int(spec.get("reps", 1)), 1)
    passes, per_pass = [], []
    for values in rows:
        values = [float(v) for v in values]
        chunks = [values[i:i + reps] for i in range(0, len(values), reps)] if len(values) % reps == 0 else [values]
        medians = [fit.median(c) for c in chunks]
        per_pass.append(medians)
        passes.append(_spread(medians))
    return {"reps_s": [[float(v) for v in values] for values in rows], "pass_median_s": per_pass,
            "pass_spread": passes}
