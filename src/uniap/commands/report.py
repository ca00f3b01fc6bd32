"""`uniap report PLAN [--run run.json] [--against OTHER] --out report.html [--png report.png]`: a static HTML report
of a plan.

Registered by the CLI as `app.command("report")(report_command)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from uniap.jsonfile import read_json_object


def load_run(path: str | Path) -> dict:
    """A run's result JSON (what `uniap run --format json` prints)."""
    return read_json_object(path, "run")


def report_command(
    plan_path: str = typer.Argument(..., metavar="PLAN", help="Plan file (uniap plan / estimate --format json)."),
    run_path: Optional[str] = typer.Option(None, "--run", help="A run's result JSON: measured beside predicted."),
    against: Optional[str] = typer.Option(None, "--against", metavar="OTHER",
                                          help="Another plan file: its summary side by side with this one's."),
    out: str = typer.Option("report.html", "--out", "-o", help="HTML file to write."),
    png: Optional[str] = typer.Option(None, "--png", help="Also write all panels as one PNG."),
) -> None:
    """Write a static HTML report of a plan: pipeline timeline, strategy map, memory and stage times."""
    from uniap.plans import Plan
    from uniap.report import render_report

    plan = Plan.load(plan_path)
    other = Plan.load(against) if against else None
    run = load_run(run_path) if run_path else None
    path = render_report(plan, Path(out), run=run, png=Path(png) if png else None, against=other)
    Console().print(f"report written to {path}" + (f" and {png}" if png else ""))
