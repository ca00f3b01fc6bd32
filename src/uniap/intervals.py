"""A calibrated plan's interval: the plan costed under each profile pass alone (the replicates), joined with the
cost model's own error for the profile's kind of device (the statistics, and why: `uniap.profile.uncertainty`);
and how the CLI prints it, and a measured time against it.

Above the planner's costing (`estimate`), as the interval is of a plan's prediction; `profile` only measures and
calibrates. Torch-free.
"""

from __future__ import annotations

from dataclasses import replace

from uniap.estimate import cost_plan, predict, workload_of
from uniap.plans import IntervalSection
from uniap.profile.calibration import calibrate, profile_of
from uniap.profile.uncertainty import (LEVEL, half_widths, method_text, model_error_of, prediction_interval,
                                       relays_out, replicate_profiles)


class Intervals:
    """Intervals of many plans under one profile: the replicate clusters are calibrated once."""

    def __init__(self, cluster, doc: dict, model, workload, profile_name: str | None = None):
        self.replicates, self.kind = replicate_profiles(doc)
        self.clusters = [calibrate(cluster, r, model=model, workload=workload) for r in self.replicates]
        self.model, self.profile_name = model, profile_name
        self.device = doc.get("device", {}).get("kind")

    @property
    def available(self) -> bool:
        return len(self.clusters) >= 2

    def of(self, plan, center: float | None = None):
        """The plan's IntervalSection (None when the profile has no spread to derive one from). center: the
        whole profile's prediction (default: the plan's `predicted` iteration time)."""
        if not self.available:
            return None
        point = float(plan.predicted["iteration_time_s"]) if center is None else float(center)
        preds = [predicted_time(plan, self.model, c) for c in self.clusters]
        error = model_error_of(self.device, relays_out(plan))
        sigma = error.sigma if error is not None else None
        low, high = prediction_interval(point, preds, sigma or 0.0)
        return IntervalSection(low_s=low, high_s=high, level=LEVEL, replicates=len(preds), kind=self.kind,
                               replicate_s=tuple(preds), method=method_text(self.kind, len(preds), error, self.device),
                               profile=self.profile_name, model_error=sigma)

    def attach(self, plan):
        """The plan with its interval (unchanged when there is none)."""
        section = self.of(plan)
        return plan if section is None else replace(plan, interval=section)


def predicted_time(plan, model, cluster) -> float:
    """The plan's iteration time under `cluster`'s cost model (what `estimate --plan` predicts)."""
    program, stage_of, strategy_of = cost_plan(plan, model, cluster)
    return float(predict(model, cluster, workload_of(plan), program, stage_of, strategy_of)["iteration_time_s"])


def with_interval(plan, model, cluster, profile_name: str | None = None):
    """`plan` (costed under `cluster`, calibrated with a profile) with its interval from that profile's spread,
    or with none (`interval=None`) when the profile records no spread or `cluster` is not calibrated."""
    doc = profile_of(cluster)
    if not doc:
        return replace(plan, interval=None)
    intervals = Intervals(cluster, doc, model, workload_of(plan), profile_name)
    return replace(plan, interval=intervals.of(plan))


NO_INTERVAL = ("no interval: the profile records no spread (written before repetitions were recorded, or with "
               "one repetition of one pass); measure it again with `uniap profile --passes 3`")


def interval_line(plan) -> str | None:
    """'predicted 12.3 ms, 90% interval 11.0–13.6 ms (...)' for a plan with an interval, else None."""
    iv = plan.interval
    if iv is None:
        return None
    point = float(plan.predicted["iteration_time_s"])
    noise, model = half_widths(point, list(iv.replicate_s), iv.model_error or 0.0)
    parts = (f"profile noise ±{noise / point * 100:.1f}%, model error ±{model / point * 100:.1f}%"
             if iv.model_error is not None else "profile noise alone")
    return (f"predicted {_ms(point)}, {int(iv.level * 100)}% interval {_ms(iv.low_s)} – {_ms(iv.high_s)} "
            f"(±{(iv.high_s - point) / point * 100:.1f}%: {parts}; {iv.method})")


def measured_against(plan, measured_s: float) -> str | None:
    """How a measured iteration time sits against the plan's interval, in one line (None without one)."""
    iv = plan.interval
    if iv is None:
        return None
    point = float(plan.predicted["iteration_time_s"])
    where = ("inside" if iv.low_s <= measured_s <= iv.high_s
             else "ABOVE" if measured_s > iv.high_s else "BELOW")
    return (f"measured {_ms(measured_s)} against predicted {_ms(point)}, {int(iv.level * 100)}% interval "
            f"{_ms(iv.low_s)} – {_ms(iv.high_s)}: {where} (error {(point - measured_s) / measured_s * 100:+.1f}%)")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms" if seconds < 10 else f"{seconds:.4g} s"
