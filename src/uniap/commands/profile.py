"""`uniap profile`: measure per-layer, per-strategy costs and collectives on the devices at hand.

Registered by the CLI as `app.command("profile")(profile_command)`. The file it writes calibrates planning:
`uniap plan --profile profile.json` / `uniap estimate --profile profile.json` (see `uniap.profile.calibrate`).
"""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from uniap.commands.options import FMT, SEQ, Fmt, emit_json
from uniap.errors import UniapError


DEFAULT_PASSES = 3
"""Launches `uniap profile` measures in by default (docs/cost-model.md, "Passes": the figures it rests on)."""
PASSES_HELP = ("Launches of the ranks, one pass over everything each (--reps repetitions per figure), merged: "
               "the median over all their repetitions, the spread between passes kept per figure (the intervals "
               "of `plan`/`estimate --profile`). Default 3: the figures are in docs/profiling.md, \"How many passes\".")


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
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[what]}"), TimeElapsedColumn(), console=console, transient=True,
                   disable=not console.is_terminal)
    task = bar.add_task("profiling", total=None, what="starting ranks")

    def update(done: int | None, total: int | None, what: str, stage: str | None = None) -> None:
        """done/total None keep the bar's counts; stage renames the bar (e.g. "running")."""
        fields = {"what": what}
        if done is not None:
            fields["completed"] = done
        if total is not None:
            fields["total"] = total
        if stage is not None:
            fields["description"] = stage
            fields["completed"], fields["total"] = 0, None
        bar.update(task, **fields)

    return bar, update


def profile_tables(doc: dict) -> list[Table]:
    """Rich tables of a profile: layer figures (measured strategies only) and collective fits."""
    sizes = doc["micro_batch_sizes"]
    method = doc["method"]
    layers = Table(title=f"{doc['model']['name']} (seq {doc['model']['seq_len']}) on {doc['world_size']} "
                         f"{doc['device']['kind']} ranks ({doc['device']['backend']}): fwd+bwd ms at "
                         f"{', '.join(map(str, sizes))} samples, median of {method['reps'] * method.get('passes', 1)}"
                         f" reps; fit a+b·n ms; activations MB per sample; static MB; optimizer ms",
                   title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col, justify in (("layer", "left"), ("d", "right"), ("strategy", "left"), ("fwd+bwd", "right"),
                         ("fit", "right"), ("act", "right"), ("static", "right"), ("opt", "right")):
        layers.add_column(col, justify=justify, no_wrap=True)
    for rec in doc["layers"]:
        if rec["runs_as"]:
            continue
        fit = rec["fit"]
        layers.add_row({"embedding": "embed"}.get(rec["kind"], rec["kind"]), str(rec["stage_size"]), rec["label"],
                       " ".join(f"{t * 1e3:.1f}" for t in rec["fwd_bwd_s"]),
                       f"{fit['a'] * 1e3:.1f}+{fit['b'] * 1e3:.2f}n", f"{rec['act_fit']['b'] / 1e6:.2f}",
                       f"{rec['static_bytes'] / 1e6:.2f}", f"{rec['optimizer_s'] * 1e3:.2f}")
    coll = Table(title="collectives (all groups at once): seconds = a + b·bytes", title_justify="left",
                 box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("op", "ranks", "a µs", "GB/s (1/b)", "sizes"):
        coll.add_column(col, justify="left" if col in ("op", "sizes") else "right", no_wrap=True)
    for rec in doc["collectives"]:
        b = rec["fit"]["b"]
        coll.add_row(rec["op"], str(rec["n"]), f"{rec['fit']['a'] * 1e6:.0f}", f"{1 / b / 1e9:.2f}" if b > 0 else "∞",
                     ", ".join(f"{x / 1024:.0f}K" for x in rec["bytes"]))
    for rec in doc.get("pipeline") or []:
        coll.add_row(f"pipeline slot ({rec['stages']} stages)", "", f"{rec['per_slot_s'] * 1e6:.0f}", "", "")
    return [layers, coll]


def profile_command(
    model: str = typer.Option(..., "--model", "-m", help="Zoo name (a gpt2/llama decoder the runtime trains) or a "
                                                          "Hugging Face config.json."),
    seq_len: Optional[int] = SEQ,
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Local ranks (default: the GPUs, or 4 CPU ranks)."),
    out: str = typer.Option("profile.json", "--out", "-o", help="Profile file to write."),
    micro_batch_sizes: str = typer.Option("1,2,4", "--micro-batch-sizes", help="Samples per dp shard at which "
                                                                                "layers are timed (a line is fitted)."),
    reps: int = typer.Option(3, "--reps", help="Timed repetitions per figure and pass (the median over every "
                                               "pass's repetitions is kept; 3 reps × 3 passes is what `uniap demo` "
                                               "measures)."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed repetitions before them."),
    passes: int = typer.Option(DEFAULT_PASSES, "--passes", help=PASSES_HELP),
    max_tp: Optional[int] = typer.Option(None, "--max-tp", help="Largest tensor-parallel degree to measure."),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds a collective may wait before profiling fails."),
    fmt: Fmt = FMT,
) -> None:
    """Measure layer times/memory per strategy and collective α–β on local ranks; write a profile for --profile."""
    from uniap.profile.collect import measure_in_launches
    from uniap.spec import load_model

    spec = load_model(model, seq_len)
    sizes = parse_sizes(micro_batch_sizes)
    err = Console(stderr=True)
    bar, update = progress_bar(err)
    with bar:
        doc = measure_in_launches(spec.config, spec.seq_len, nproc, passes, micro_batch_sizes=sizes, reps=reps,
                                  warmup=warmup, max_tp=max_tp, timeout_s=timeout_s, progress=update)
    try:
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    except OSError as exc:
        raise UniapError(f"cannot write profile {out}: {exc.strerror or exc}") from None
    if fmt is Fmt.json:
        emit_json(doc)
        return
    console = Console()
    for table in profile_tables(doc):
        console.print(table)
    console.print(f"profile written to {out} ({doc['wall_seconds']:.0f} s); use it with "
                  f"`uniap plan --profile {out}` or `uniap estimate --profile {out}`")
