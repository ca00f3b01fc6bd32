"""Plan reports: a static HTML page with embedded SVG figures (pipeline timeline, per-layer strategy map, memory
and stage times per stage, measured beside predicted when a run is given), per-layer figures, a warning when the
simulated timeline and the predicted time disagree, and optionally a second plan side by side."""

from uniap.report.render import recost, render_report
from uniap.report.timeline import Box, simulate

__all__ = ["Box", "recost", "render_report", "simulate"]
