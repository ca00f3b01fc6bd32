"""`uniap compare`: UniAP and the baselines side by side on the same cost model.

Registered by the CLI as `app.command("compare")(compare_command)`; flags as `uniap estimate`'s.
"""

from __future__ import annotations

from enum import Enum
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from uniap.commands.options import (ATTENTION_FLAG, BATCH, CLUSTER, FMT, KERNELS_FLAG, MODEL, PREC, SCHED, SEQ, SOLVER,
                                    AttentionKernel, Fmt, Kernels, Precision, Schedule, emit_json, resolve_precision,
                                    with_engine)
from uniap.errors import UniapError
from uniap.views import fmt_time


def _value(option):
    return option.value if isinstance(option, Enum) else option


def _time(seconds: float | None) -> str:
    return "—" if seconds is None else fmt_time(seconds)


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
    model: str = MODEL,
    cluster: str = CLUSTER,
    global_batch: int = BATCH,
    seq_len: Optional[int] = SEQ,
    precision: Optional[Precision] = PREC,
    methods: Optional[List[str]] = typer.Option(
        None, "--methods", help="Comma-separated (or repeated): uniap, megatron-grid, galvatron, alpa, dp, zero3 "
                                "(default: all)."),
    schedule: Schedule = SCHED,
    kernels: Optional[Kernels] = KERNELS_FLAG,
    attention: Optional[AttentionKernel] = ATTENTION_FLAG,
    fmt: Fmt = FMT,
    solver: str = SOLVER,
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Seconds for UniAP's search (default: "
                                                                          "the planner's)."),
) -> None:
    """Compare UniAP with Megatron grid search, Galvatron, Alpa, DDP and ZeRO-3 on the same cost model."""
    from uniap.baselines.comparison import compare, parse_methods
    from uniap.spec import load_model
    from uniap.spec.cluster import load_cluster
    from uniap.spec.workload import Workload

    names = parse_methods(methods)  # check the names before any (slow) search
    if _value(schedule) == "interleaved-1f1b":
        raise UniapError("compare runs the baselines' schedules (gpipe, 1f1b); plan interleaving with "
                         "`uniap plan --schedule interleaved-1f1b`")
    if global_batch is None or global_batch < 1:
        raise UniapError(f"global batch must be >= 1, got {global_batch}")
    spec = load_model(model, seq_len)
    clus = with_engine(load_cluster(cluster), kernels, attention)
    workload = Workload(global_batch, spec.seq_len, resolve_precision(precision, clus))
    result = compare(spec, clus, workload, methods=names, schedule=_value(schedule), solver=solver,
                     time_limit=time_limit)
    if _value(fmt) == "json":
        emit_json(result)
        return
    console = Console()
    console.print(comparison_table(result))
    ours = next((r for r in result["rows"] if r["method"] == "uniap"), None)
    others = [r for r in result["rows"] if r["method"] != "uniap" and r["speedup_of_uniap"] is not None]
    if ours is not None and ours["fits"] and others:
        best = min(others, key=lambda r: r["iteration_time_s"])
        console.print(f"uniap vs the best baseline ({best['method']}): {best['speedup_of_uniap']:.2f}× "
                      f"({_time(best['iteration_time_s'])} → {_time(ours['iteration_time_s'])})")
