"""`uniap compare`: UniAP and the baselines side by side on the same cost model.

Registered by the CLI as `app.command("compare")(compare_command)`; flags as `uniap estimate`'s.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from uniap.errors import UniapError


class Precision(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"


class Schedule(str, Enum):
    gpipe = "gpipe"
    f1b = "1f1b"


class Fmt(str, Enum):
    table = "table"
    json = "json"


def _value(option):
    return option.value if isinstance(option, Enum) else option


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.2f} ms"


def comparison_table(result: dict, title: str | None = None) -> Table:
    """The rich table of a `compare` result: one row per method."""
    wl = result.get("workload", {})
    title = title or (f"{result.get('model', '')} on {result.get('cluster', '')}, global batch "
                      f"{wl.get('global_batch', '?')}, {wl.get('precision', '')}, {result.get('schedule', '')}")
    table = Table(title=title, title_justify="left")
    for col, justify in (("method", "left"), ("iteration time", "right"), ("samples/s", "right"),
                         ("uniap speed-up", "right"), ("search time", "right"), ("fits", "center"),
                         ("configuration", "left")):
        table.add_column(col, justify=justify)
    for row in result["rows"]:
        speed = row["speedup_of_uniap"]
        table.add_row(
            f"[bold]{row['method']}[/bold]" if row["method"] == "uniap" else row["method"],
            _time(row["iteration_time_s"]),
            "—" if row["throughput_samples_per_s"] is None else f"{row['throughput_samples_per_s']:.2f}",
            "—" if speed is None else f"{speed:.2f}×",
            f"{row['search_time_s']:.2f} s",
            "yes" if row["fits"] else "[red]no[/red]",
            row.get("error") or row.get("config", ""),
        )
    return table


def compare_command(
    model: str = typer.Option(..., "--model", "-m", help="Zoo name or Hugging Face config.json."),
    cluster: str = typer.Option(..., "--cluster", "-c", help="PRESET:NODESxDEVICES or a YAML file."),
    global_batch: int = typer.Option(..., "--global-batch", "-b", help="Samples per iteration."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-s", help="Sequence length (default: the model's)."),
    precision: Precision = typer.Option(Precision.bf16, "--precision", help="fp32, or mixed precision fp16/bf16."),
    methods: Optional[List[str]] = typer.Option(
        None, "--methods", help="Comma-separated (or repeated): uniap, megatron-grid, galvatron, alpa, dp, zero3 "
                                "(default: all)."),
    schedule: Schedule = typer.Option(Schedule.f1b, "--schedule", help="Pipeline schedule."),
    fmt: Fmt = typer.Option(Fmt.table, "--format", "-f", help="table for people, json for programs."),
    solver: str = typer.Option("highs", "--solver", help="MIQP back-end for UniAP: highs, scip or gurobi."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Seconds for UniAP's search (default: "
                                                                          "the planner's)."),
) -> None:
    """Compare UniAP with Megatron grid search, Galvatron, Alpa, DDP and ZeRO-3 on the same cost model."""
    from uniap.baselines.comparison import compare, parse_methods
    from uniap.spec import load_model
    from uniap.spec.cluster import load_cluster
    from uniap.spec.workload import Workload

    names = parse_methods(methods)  # check the names before any (slow) search
    if global_batch is None or global_batch < 1:
        raise UniapError(f"global batch must be >= 1, got {global_batch}")
    spec = load_model(model, seq_len)
    clus = load_cluster(cluster)
    workload = Workload(global_batch, spec.seq_len, _value(precision))
    result = compare(spec, clus, workload, methods=names, schedule=_value(schedule), solver=solver,
                     time_limit=time_limit)
    if _value(fmt) == "json":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    console = Console()
    console.print(comparison_table(result))
    ours = next((r for r in result["rows"] if r["method"] == "uniap"), None)
    others = [r for r in result["rows"] if r["method"] != "uniap" and r["speedup_of_uniap"] is not None]
    if ours is not None and ours["fits"] and others:
        best = min(others, key=lambda r: r["iteration_time_s"])
        console.print(f"uniap vs the best baseline ({best['method']}): {best['speedup_of_uniap']:.2f}× "
                      f"({_time(best['iteration_time_s'])} → {_time(ours['iteration_time_s'])})")
