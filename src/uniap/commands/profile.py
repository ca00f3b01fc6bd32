"""`uniap profile`: measure per-layer, per-strategy costs and collectives on the devices at hand.

Registered by the CLI as `app.command("profile")(profile_command)`. The file it writes calibrates planning:
`uniap plan --profile profile.json` / `uniap estimate --profile profile.json` (see `uniap.profile.calibrate`).
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


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UniapError(f"--micro-batch-sizes must be comma-separated integers, got {text!r}") from None
    if len(set(sizes)) < 2 or min(sizes) < 1:
        raise UniapError(f"--micro-batch-sizes needs at least two different positive sizes, got {text!r}")
    return sorted(set(sizes))


def progress_bar(console: Console):
    """A rich progress bar on `console` (stderr), drawn only when it is a terminal; returns (context, callback)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]profiling"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[what]}"),
                   TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task("profile", total=None, what="starting ranks")

    def update(done: int, total: int, what: str) -> None:
        bar.update(task, completed=done, total=total, what=what)

    return bar, update


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def profile_tables(doc: dict) -> list[Table]:
    """Rich tables of a profile: layer figures (measured strategies only) and collective fits."""
    sizes = doc["micro_batch_sizes"]
    layers = Table(title=f"{doc['model']['name']} (seq {doc['model']['seq_len']}) on {doc['world_size']} "
                         f"{doc['device']['kind']} ranks ({doc['device']['backend']}), median of "
                         f"{doc['method']['reps']} reps after {doc['method']['warmup']} warm-up",
                   title_justify="left")
    layers.add_column("layer")
    layers.add_column("ranks", justify="right")
    layers.add_column("strategy")
    for m in sizes:
        layers.add_column(f"fwd+bwd ms @{m}", justify="right")
    for col in ("fit ms: a + b·n", "act MB/sample", "static MB", "optim ms"):
        layers.add_column(col, justify="right")
    for rec in doc["layers"]:
        if rec["runs_as"]:
            continue
        fit = rec["fit"]
        layers.add_row(rec["kind"], str(rec["stage_size"]), rec["label"], *[_ms(t) for t in rec["fwd_bwd_s"]],
                       f"{fit['a'] * 1e3:.2f} + {fit['b'] * 1e3:.2f}·n", f"{rec['act_fit']['b'] / 1e6:.2f}",
                       f"{rec['static_bytes'] / 1e6:.2f}", _ms(rec["optimizer_s"]))
    coll = Table(title="collectives (all groups at once): seconds = a + b·bytes", title_justify="left")
    for col in ("op", "ranks", "a (µs)", "GB/s (1/b)", "sizes"):
        coll.add_column(col, justify="left" if col in ("op", "sizes") else "right")
    for rec in doc["collectives"]:
        b = rec["fit"]["b"]
        coll.add_row(rec["op"], str(rec["n"]), f"{rec['fit']['a'] * 1e6:.0f}", f"{1 / b / 1e9:.2f}" if b > 0 else "∞",
                     ", ".join(f"{x / 1024:.0f}K" for x in rec["bytes"]))
    return [layers, coll]


def profile_command(
    model: str = typer.Option(..., "--model", "-m", help="Zoo name (a gpt2/llama decoder the runtime trains) or a "
                                                          "Hugging Face config.json."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-s", help="Sequence length (default: the model's)."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Local ranks (default: the GPUs, or 4 CPU ranks)."),
    out: str = typer.Option("profile.json", "--out", "-o", help="Profile file to write."),
    micro_batch_sizes: str = typer.Option("1,2,4", "--micro-batch-sizes", help="Samples per dp shard at which "
                                                                                "layers are timed (a line is fitted)."),
    reps: int = typer.Option(5, "--reps", help="Timed repetitions per figure (median kept)."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed repetitions before them."),
    max_tp: Optional[int] = typer.Option(None, "--max-tp", help="Largest tensor-parallel degree to measure."),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds a collective may wait before profiling fails."),
    fmt: Fmt = typer.Option(Fmt.table, "--format", "-f", help="table for people, json for programs."),
) -> None:
    """Measure layer times/memory per strategy and collective α–β on local ranks; write a profile for --profile."""
    from uniap.profile.collect import profile_model
    from uniap.spec import load_model

    spec = load_model(model, seq_len)
    sizes = parse_sizes(micro_batch_sizes)
    err = Console(stderr=True)
    bar, update = progress_bar(err)
    with bar:
        doc = profile_model(spec.config, spec.seq_len, nproc, micro_batch_sizes=sizes, reps=reps, warmup=warmup,
                            max_tp=max_tp, timeout_s=timeout_s, progress=update)
    try:
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    except OSError as exc:
        raise UniapError(f"cannot write profile {out}: {exc.strerror or exc}") from None
    if fmt is Fmt.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    console = Console()
    for table in profile_tables(doc):
        console.print(table)
    console.print(f"profile written to {out} ({doc['wall_seconds']:.0f} s); use it with "
                  f"`uniap plan --profile {out}` or `uniap estimate --profile {out}`")
