"""Plan reports: a static HTML page with embedded PNG images (pipeline timeline, per-layer strategy map, memory
and stage times per stage, measured beside predicted when a run is given)."""

from uniap.report.render import recost, render_report
from uniap.report.timeline import Box, simulate, stage_order

__all__ = ["Box", "recost", "render_report", "simulate", "stage_order"]
