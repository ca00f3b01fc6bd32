"""How far a calibrated prediction can be trusted: an interval from the spread of the profile it was costed with.

Torch-free (planning with a profile needs no torch).

A profile measured in N ≥ 2 passes holds, for every measured point (a layer and strategy at a micro-batch size,
a collective at a message size), the median of each pass (`pass_median_s`, written by `profile.collect`). The
profile of pass k alone is a *replicate*: the same figures as a user who had measured only then would have got.
Costing a plan with each of the n replicates gives n predictions p_1..p_n; their standard deviation s is how much
the prediction moves with the machine's state at the time of measuring. The interval is the Student-t prediction
interval for one more such prediction (one more pass, as a later run samples the machine again):

    predicted ± t(0.95, n − 1) · s · √(1 + 1/n)          (nominal 90 %)

around the prediction of the whole profile. A one-pass profile has no spread between passes; its replicates are
then its repetitions (repetition k of every figure), back to back within seconds: they miss the drift of a shared
machine over minutes, so such an interval is narrower than the truth (the method says so). A profile older than
the recording of repetitions has no interval. Figures the profile keeps only as medians (the whole-chain
all-reduce scale, the pipeline slot cost, memory) are the same in every replicate.

The profile's noise is not the whole uncertainty: the cost model has its own error, a plan it misprices is wrong by
the same amount in every pass. Where that error has been measured for the profile's kind of device
(`model_error.json`: plans run and predicted, with their profiles' spread), it joins the interval in quadrature:

    predicted ± √(h_p² + h_m²),   h_p = t(0.95, n − 1)·s·√(1 + 1/n),   h_m = z(0.95)·σ_m·predicted

σ_m is fitted on those runs alone: the mean squared relative error of the predictions less the part the profiles'
spread explains (`fit_model_error`), apart for plans that keep one layout and plans that re-lay out between layers
(`relays_out`), whose re-layouts the model prices worst. It is not tuned towards a coverage target; runs it was
not fitted on check it (`benchmarks/demo_accuracy.py`). A kind of device without such runs gets h_p alone, and the
method says so.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from uniap.errors import UniapError

LEVEL = 0.90
"""Nominal coverage of the intervals (two-sided)."""

_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)
"""Student's t 0.95 quantile for 1..30 degrees of freedom (1.645, the normal's, beyond)."""


Z95 = 1.645
"""The normal 0.95 quantile: the model-error term's half-width in standard deviations (two-sided 90 %)."""

MODEL_ERROR_FILE = Path(__file__).with_name("model_error.json")
"""The runs each kind of device's model error is fitted on (`model_error_of`)."""


@dataclass(frozen=True)
class ModelError:
    """The calibrated cost model's own error on one kind of device and one class of plan, beyond the profile's
    noise."""

    sigma: float
    """Relative standard deviation of (measured − predicted) / predicted that the profiles' spread leaves unexplained."""
    plans: int
    """Plan runs it was fitted on."""
    relayout: bool
    """The class: plans that re-lay out between layers (`relays_out`), or plans that keep one layout."""
    source: str
    """Where they were measured, in words."""

    @property
    def of_what(self) -> str:
        return "plans that re-lay out between layers" if self.relayout else "plans that keep one layout"


CLASSES = {False: "one layout", True: "relayout"}
"""The classes of plan the model error is fitted apart for, by `relays_out`, and their short names."""


def relays_out(plan) -> bool:
    """Whether the plan's layers use more than one layout (how parameters and activations are split: dp, tp, cp,
    ep, ZeRO; recompute aside), so that activations are re-laid out between some of them. The model prices those
    re-layouts worst: ranks skew at each, and a pipeline of unequal layouts keeps fewer ranks busy than it counts."""
    return len({replace(layer.strategy, recompute="none") for layer in plan.layers}) > 1


def fit_model_error(rows: list[dict]) -> float:
    """σ_m of plans run and predicted (`predicted_s`, `measured_s`, `replicate_s`: the prediction with each pass
    of its profile alone): σ_m² = mean(e²) − mean(s²·(1 + 1/n)), e = (measured − predicted) / predicted and s the
    replicates' standard deviation over the prediction, the part of e² that one more pass's noise explains
    (0 if the noise explains it all)."""
    if not rows:
        raise UniapError("a model error needs at least one plan run and predicted")
    errors = [((r["measured_s"] - r["predicted_s"]) / r["predicted_s"]) ** 2 for r in rows]
    noise = [(statistics.stdev(r["replicate_s"]) / r["predicted_s"]) ** 2 * (1.0 + 1.0 / len(r["replicate_s"]))
             for r in rows]
    return math.sqrt(max(statistics.fmean(errors) - statistics.fmean(noise), 0.0))


def fit_classes(rows: list[dict]) -> dict[str, float]:
    """σ_m of each class of plan (`CLASSES`) that `rows` hold (each row with its `relayout`)."""
    return {name: fit_model_error([r for r in rows if bool(r["relayout"]) == relayout])
            for relayout, name in CLASSES.items() if any(bool(r["relayout"]) == relayout for r in rows)}


@functools.cache
def _model_error_runs() -> dict:
    return json.loads(MODEL_ERROR_FILE.read_text())["kinds"]


@functools.cache
def model_error_of(kind: str | None, relayout: bool) -> ModelError | None:
    """The model error measured for profiles of `kind` ("cpu", "cuda") on plans of the class `relayout`, or None
    where no runs measured it (a kind whose runs hold no plan of the class: fitted on all of its runs)."""
    entry = _model_error_runs().get(kind)
    if entry is None:
        return None
    rows = [r for r in entry["rows"] if bool(r["relayout"]) == relayout] or entry["rows"]
    return ModelError(sigma=fit_model_error(rows), plans=len(rows), relayout=relayout,
                      source=f"{entry['device']}; {entry['measured']}")


def t95(dof: int) -> float:
    """Student's t 0.95 quantile with `dof` degrees of freedom."""
    if dof < 1:
        raise UniapError(f"a t quantile needs at least one degree of freedom, got {dof}")
    return _T95[dof - 1] if dof <= len(_T95) else 1.645


def half_widths(center: float, replicates: list[float], model_error: float = 0.0) -> tuple[float, float]:
    """(h_p, h_m): the profile noise's half-width t(0.95, n − 1)·s·√(1 + 1/n), s the sample standard deviation of
    `replicates` (n ≥ 2), and the model error's z(0.95)·`model_error`·center."""
    n = len(replicates)
    if n < 2:
        raise UniapError(f"an interval needs at least 2 replicate predictions, got {n}")
    return t95(n - 1) * statistics.stdev(replicates) * math.sqrt(1.0 + 1.0 / n), Z95 * model_error * center


def prediction_interval(center: float, replicates: list[float], model_error: float = 0.0) -> tuple[float, float]:
    """center ± √(h_p² + h_m²) (`half_widths`); the low end is kept at 0 or above."""
    half = math.hypot(*half_widths(center, replicates, model_error))
    return max(center - half, 0.0), center + half


def replicate_profiles(doc: dict) -> tuple[list[dict], str]:
    """The profile's replicates (see the module docstring) and what they are: "passes", "repetitions", or
    "none" (an empty list) for a profile without recorded repetitions or with only one of each."""
    records = list(doc["layers"]) + list(doc["collectives"])
    if not records or not all("pass_median_s" in r and "reps_s" in r for r in records):
        return [], "none"
    passes = min(len(m) for r in records for m in r["pass_median_s"])
    key, kind = ("pass_median_s", "passes") if passes >= 2 else ("reps_s", "repetitions")
    n = passes if passes >= 2 else min(len(v) for r in records for v in r["reps_s"])
    if n < 2:
        return [], "none"
    return [rebuilt(doc, lambda rec, j, k=k: float(rec[key][j][k])) for k in range(n)], kind


def first_passes(doc: dict, k: int) -> dict:
    """The profile as it stood after its first `k` passes (medians over their repetitions; the figures kept
    only as medians unchanged)."""
    from uniap.profile.fit import median

    reps = int(doc["method"]["reps"])
    records = list(doc["layers"]) + list(doc["collectives"])
    if not all("reps_s" in r for r in records):
        raise UniapError("the profile records no repetitions (measured before they were recorded)")
    return rebuilt(doc, lambda rec, j: median(rec["reps_s"][j][:k * reps]))


def rebuilt(doc: dict, figure) -> dict:
    """`doc` with every measured point's time replaced by figure(record, point index) and its fits redone."""
    from uniap.profile.fit import fit_line
    from uniap.profile.schema import fitted_figures
    from uniap.spec.model import ModelConfig

    layers = []
    for rec in doc["layers"]:
        total = [figure(rec, j) for j in range(len(rec["samples"]))]
        ratio = [t / m if m > 0 else 1.0 for t, m in zip(total, rec["fwd_bwd_s"])]
        layers.append({**rec, "fwd_bwd_s": total, "fit": fit_line(rec["samples"], total).to_json(),
                       "fwd_s": [f * q for f, q in zip(rec["fwd_s"], ratio)],
                       "bwd_s": [b * q for b, q in zip(rec["bwd_s"], ratio)]})
    collectives = []
    for rec in doc["collectives"]:
        med = [figure(rec, j) for j in range(len(rec["bytes"]))]
        collectives.append({**rec, "median_s": med, "fit": fit_line(rec["bytes"], med).to_json()})
    out = {**doc, "layers": layers, "collectives": collectives}
    out["fitted"] = fitted_figures(out, ModelConfig(**doc["model"]["config"]), int(doc["model"]["seq_len"]))
    return out


def method_text(kind: str, n: int, model_error: ModelError | None, device: str | None) -> str:
    """How an interval of `kind` over `n` replicates was derived, in words (printed and kept in the plan)."""
    what = {"passes": f"the {n} profile passes, each costed alone",
            "repetitions": f"the {n} repetitions of a one-pass profile, each costed alone (back to back: they "
                           "miss the drift of a shared machine, so the interval is too narrow; measure with "
                           "`uniap profile --passes 3` or more)"}[kind]
    noise = f"t(0.95, {n - 1}) · s · √(1 + 1/{n}), s the standard deviation of the predictions of {what}"
    if model_error is None:
        return (f"{int(LEVEL * 100)}% prediction interval: whole-profile prediction ± {noise}; the cost model's own "
                f"error is not in it: no runs measured it on {device or 'this kind of'} devices")
    return (f"{int(LEVEL * 100)}% prediction interval: whole-profile prediction ± √(h_p² + h_m²), profile noise "
            f"h_p = {noise}; model error h_m = {Z95} · {model_error.sigma * 100:.1f}% · prediction, the cost model's "
            f"own error on {device} devices for {model_error.of_what} beyond the profile's noise, fitted on "
            f"{model_error.plans} such plans run and predicted ({model_error.source})")
