"""`uniap demo`: profile → plan → run → predicted vs measured, on this machine's ranks.

Registered by the CLI as `app.command("demo")(demo_command)`.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from uniap.errors import UniapError


class Fmt(str, Enum):
    table = "table"
    json = "json"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def demo_table(result: dict) -> Table:
    table = Table(title=f"{result['model']['name']} ({result['model']['parameters'] / 1e6:.1f} M parameters, seq "
                        f"{result['model']['seq_len']}, global batch {result['global_batch']}) on {result['cluster']}",
                  title_justify="left")
    for col, justify in (("plan", "left"), ("predicted", "right"), ("measured", "right"), ("error", "right"),
                         ("pred. rank", "right"), ("meas. rank", "right"), ("pred. mem", "right"),
                         ("meas. mem", "right"), ("mem error", "right"), ("layout", "left")):
        table.add_column(col, justify=justify)
    for r in sorted(result["rows"], key=lambda r: r["measured_rank"]):
        name = f"[bold]{r['plan']}[/bold]" if r["chosen"] else r["plan"]
        merr = r.get("memory_error")
        table.add_row(name, _ms(r["predicted_s"]), _ms(r["measured_s"]), f"{r['error'] * 100:+.1f}%",
                      str(r["predicted_rank"]), str(r["measured_rank"]),
                      f"{r['predicted_memory_bytes'] / 1e6:.1f} MB", f"{r['measured_memory_bytes'] / 1e6:.1f} MB",
                      "—" if merr is None else f"{merr * 100:+.1f}%", r["description"])
    return table


def summary_lines(result: dict) -> list[str]:
    lines = [f"median absolute relative error: [bold]{result['median_abs_rel_error'] * 100:.1f}%[/bold]   "
             f"Kendall τ: [bold]{result['kendall_tau']:.2f}[/bold]   regret of the chosen plan: "
             f"[bold]{(result['regret'] or 0.0) * 100:.1f}%[/bold]"]
    if result.get("memory_median_abs_rel_error") is not None:
        lines.append(f"memory (model states + saved activations, per rank): median |error| "
                     f"{result['memory_median_abs_rel_error'] * 100:.1f}%, max "
                     f"{result['memory_max_abs_rel_error'] * 100:.1f}%")
    t = result["timings_s"]
    lines.append(f"profile {t['profile_s']:.0f} s, plan {t['plan_s']:.0f} s, runs {t['run_s']:.0f} s, total "
                 f"{t['total_s']:.0f} s; figure: {result['figure']}; plan: {result['chosen_plan']}")
    return lines


def demo_command(
    out_dir: str = typer.Option("out/demo", "--out-dir", help="Folder for the profile, plans, figure and demo.json."),
    nproc: int = typer.Option(4, "--nproc", help="Local ranks (CPU processes over gloo, or GPUs over NCCL)."),
    steps: int = typer.Option(8, "--steps", help="Training steps per plan (the first is a warm-up)."),
    reps: int = typer.Option(7, "--reps", help="Timed repetitions per profiled figure."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Reuse this profile instead of measuring one."),
    time_limit: Optional[float] = typer.Option(60.0, "--time-limit", help="Seconds for the plan search."),
    fmt: Fmt = typer.Option(Fmt.table, "--format", "-f", help="table for people, json for programs."),
) -> None:
    """Profile a small GPT on local ranks, plan it, run the chosen plan and 12 others, report predicted vs measured."""
    from uniap.commands.profile import progress_bar
    from uniap.profile.demo import run_demo

    if nproc < 1:
        raise UniapError("--nproc must be >= 1")
    err = Console(stderr=True)
    bar, update = progress_bar(err)

    def say(text: str) -> None:
        if err.is_terminal:
            err.print(f"[dim]uniap demo:[/dim] {text}")

    with bar:
        result = run_demo(out_dir, nproc=nproc, steps=steps, reps=reps, profile_path=profile, time_limit=time_limit,
                          progress=update, say=say)
    if fmt is Fmt.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    console = Console()
    console.print(demo_table(result))
    for line in summary_lines(result):
        console.print(line)
