"""`uniap export PLAN --to ENGINE --out FILE`: a plan as torchtitan's job TOML, Megatron-LM's launch flags or
DeepSpeed's config JSON. Registered by the CLI as `app.command("export")(export_command)`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from uniap.commands.options import choices
from uniap.errors import UniapError
from uniap.export import ENGINES

EngineName = choices("EngineName", ENGINES)
"""The engines `--to` and `plan --engine` accept."""


def export_command(
    plan_path: str = typer.Argument(..., metavar="PLAN",
                                    help="Plan file (from `uniap plan` or `estimate --format json`)."),
    to: EngineName = typer.Option(..., "--to",
                                  help="torchtitan (job TOML), megatron (launch script), deepspeed (config JSON)."),
    out_path: Optional[str] = typer.Option(None, "--out", "-o", help="Write here (default: stdout)."),
) -> None:
    """Write a plan as an engine's configuration; a plan the engine cannot run is refused in one line."""
    from uniap.export import export_plan
    from uniap.plans import Plan

    text = export_plan(Plan.load(plan_path), to.value)
    if out_path is None:
        typer.echo(text, nl=False)
        return
    try:
        Path(out_path).write_text(text)
    except OSError as exc:
        raise UniapError(f"cannot write {out_path}: {exc.strerror}") from None
    typer.echo(f"{to.value} configuration written to {out_path}", err=True)
