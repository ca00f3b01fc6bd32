"""`uniap demo`: profile → plan → run → predicted vs measured, on this machine's ranks.

Registered by the CLI as `app.command("demo")(demo_command)`.
"""

from __future__ import annotations

from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from uniap.commands.options import FMT, Fmt, emit_json


def demo_table(result: dict) -> Table:
    """One row per plan, fastest measured first: predicted time and its interval (✗: measured outside it),
    measured time, error, ranks, memory."""
    table = Table(title=f"{result['model']['name']} ({result['model']['parameters'] / 1e6:.1f} M parameters, seq "
                        f"{result['model']['seq_len']}, global batch {result['global_batch']}) on {result['cluster']}: "
                        f"iteration time and peak memory per rank, predicted vs measured",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    intervals = any(r.get("interval_s") for r in result["rows"])
    for col, justify in (("plan", "left"), ("pred ms", "right"), ("90% interval", "right"), ("meas ms", "right"),
                         ("error", "right"), ("rank p/m", "right"), ("mem MB p/m", "right"), ("mem err", "right")):
        if col != "90% interval" or intervals:
            table.add_column(col, justify=justify, no_wrap=True)
    for r in sorted(result["rows"], key=lambda r: r["measured_rank"]):
        name = f"[bold]{r['plan']}[/bold]" if r["chosen"] else r["plan"]
        merr = r.get("memory_error")
        span = r.get("interval_s")
        cells = [f"{span[0] * 1e3:.1f}–{span[1] * 1e3:.1f}" + ("" if r["inside"] else " ✗")] if span else (
            ["—"] if intervals else [])
        table.add_row(name, f"{r['predicted_s'] * 1e3:.1f}", *cells, f"{r['measured_s'] * 1e3:.1f}",
                      f"{r['error'] * 100:+.1f}%", f"{r['predicted_rank']}/{r['measured_rank']}",
                      f"{r['predicted_memory_bytes'] / 1e6:.1f}/{r['measured_memory_bytes'] / 1e6:.1f}",
                      "—" if merr is None else f"{merr * 100:+.1f}%")
    return table


def layouts(result: dict) -> list[str]:
    return [f"  {r['plan']}: {r['description']}" for r in sorted(result["rows"], key=lambda r: r["measured_rank"])]


def summary_lines(result: dict) -> list[str]:
    lines = [f"median absolute relative error: [bold]{result['median_abs_rel_error'] * 100:.1f}%[/bold]   "
             f"Kendall τ: [bold]{result['kendall_tau']:.2f}[/bold]   regret of the chosen plan: "
             f"[bold]{(result['regret'] or 0.0) * 100:.1f}%[/bold]"]
    if result.get("round_spread") is not None:
        lines.append(f"noise: one plan's rounds differ by {result['round_spread'] * 100:.1f}% (median over the plans, "
                     "max/min − 1), a floor under these errors that no profile sees")
    if result.get("memory_median_abs_rel_error") is not None:
        lines.append(f"memory (model states + saved activations, per rank): median |error| "
                     f"{result['memory_median_abs_rel_error'] * 100:.1f}%, max "
                     f"{result['memory_max_abs_rel_error'] * 100:.1f}%")
    same = result.get("whole_profile_chooses_the_same_plan")
    if same is not None:
        lines.append(f"planned with {result['planned_with']}; predictions use every pass (the later ones measured "
                     "between the rounds); the whole profile chooses "
                     + ("the same plan" if same else f"another: {result['whole_profile_plan']}"))
    if result.get("inside_interval") is not None:
        inside = [r for r in result["rows"] if r.get("inside")]
        lines.append(f"measured inside their predicted interval: [bold]{len(inside)} of {len(result['rows'])}"
                     f"[/bold] ({result['interval_method']})")
    here, used = result.get("model_error_here") or {}, result.get("model_error_used") or {}
    if isinstance(here, dict) and any(v is not None for v in here.values()):
        lines.append("model error these runs alone would fit: " + ", ".join(
            f"{what} {value * 100:.1f}%" + (f" (the intervals hold {used[what] * 100:.1f}%)"
                                             if used.get(what) is not None else "")
            for what, value in here.items() if value is not None))
    if len(result.get("by_passes") or {}) > 1:
        lines.append("median |error| costed with the first k profile passes only: " + ", ".join(
            f"k={k} {v['median_abs_rel_error'] * 100:.1f}% (τ {v['kendall_tau']:.2f})"
            for k, v in result["by_passes"].items()))
    if result.get("profile_error"):
        lines.append(f"profiling stopped early: {result['profile_error']}")
    t = result["timings_s"]
    lines.append(f"profile {t['profile_s']:.0f} s, plan {t['plan_s']:.0f} s, runs {t['run_s']:.0f} s, total "
                 f"{t['total_s']:.0f} s; figure: {result['figure']}; plan: {result['chosen_plan']}")
    return lines


def demo_command(
    out_dir: str = typer.Option("out/demo", "--out-dir", help="Folder for the profile, plans, figure and demo.json."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Zoo name or config.json of the model (default: "
                                        "the demo's GPT, 4 blocks of hidden 256); the runtime's decoder families."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-s", help="Tokens per sequence (default: 64)."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b", help="Sequences per step (default: 16)."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Local ranks: the GPUs over NCCL, else 4 CPU processes "
                                                             "over gloo."),
    steps: int = typer.Option(8, "--steps", help="Training steps per plan and round (the first 2 are a warm-up)."),
    rounds: int = typer.Option(3, "--rounds", help="Rounds over all plans (interleaved: a slow spell of a shared "
                                                   "machine touches every plan a little)."),
    reps: int = typer.Option(3, "--reps", help="Timed repetitions per profiled figure and pass."),
    passes: int = typer.Option(3, "--passes", help="Profiling passes over everything, spread over the rounds (the "
                                                   "first before planning)."),
    profile: Optional[str] = typer.Option(None, "--profile", help="Reuse this profile instead of measuring one."),
    time_limit: Optional[float] = typer.Option(60.0, "--time-limit", help="Seconds for the plan search."),
    fmt: Fmt = FMT,
) -> None:
    """Profile a small GPT (or --model) on local ranks, plan it, run the chosen plan and 12 others, report predicted
    vs measured."""
    from uniap.commands.profile import progress_bar
    from uniap.demo import DEMO_BATCH, DEMO_MODEL, DEMO_SEQ, run_demo
    from uniap.spec import load_model

    config = DEMO_MODEL if model is None else load_model(model).config

    err = Console(stderr=True)
    bar, update = progress_bar(err)

    def say(text: str) -> None:
        if err.is_terminal:
            err.print(f"[dim]uniap demo:[/dim] {text}")
            update(None, None, text, stage=text.split()[0])

    with bar:
        result = run_demo(out_dir, nproc=nproc, steps=steps, rounds=rounds, reps=reps, passes=passes,
                          profile_path=profile, time_limit=time_limit, progress=update, say=say, config=config,
                          seq_len=seq_len or DEMO_SEQ, global_batch=global_batch or DEMO_BATCH)
    if fmt is Fmt.json:
        emit_json(result)
        return
    console = Console()
    console.print(demo_table(result))
    for line in summary_lines(result):
        console.print(line)
    console.print("plans (stages separated by |):")
    for line in layouts(result):
        console.print(line, highlight=False)
