"""Human views of plans and predictions (rich tables). JSON views are the plan contract itself."""

from __future__ import annotations

from itertools import groupby

from rich.console import Console
from rich.table import Table

from uniap.plans import Plan

GB = 1e9


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    return f"{seconds * 1e3:.2f} ms"


def layer_runs(plan: Plan, stage: int) -> list[tuple[str, object, int]]:
    """Consecutive layers of one stage that share a strategy: (names, strategy, count), e.g. ("block.0–block.9",
    tp2·dp4, 10)."""
    layers = [layer for layer in plan.layers if layer.stage == stage]
    out = []
    for (_, strategy), run in groupby(layers, key=lambda layer: (layer.position, layer.strategy)):
        run = list(run)  # a run ends at a chunk boundary too
        out.append((run[0].name if len(run) == 1 else f"{run[0].name}–{run[-1].name}", strategy, len(run)))
    return out


def strategy_runs(plan: Plan, stage: int) -> str:
    """Run-length grouped strategies of one stage, e.g. `embed: dp8·z3 | block.0-block.9: tp2·dp4 ×10`."""
    return "\n".join(f"{names}: {strategy.label()}" + (f" ×{count}" if count > 1 else "")
                     for names, strategy, count in layer_runs(plan, stage))


def describe(plan: Plan) -> str:
    """A plan in one line: pipeline, then per stage its run-length grouped strategies (stages split by |)."""
    stages = [", ".join(f"{names} {strategy.label()}" for names, strategy, _ in layer_runs(plan, stage.index))
              for stage in plan.stages]
    pipe = plan.pipeline
    chunks = f"·v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    head = f"pp{pipe.degree}{chunks} c={pipe.micro_batches} {pipe.schedule}: " if pipe.degree > 1 else \
        f"c={pipe.micro_batches}: "
    return head + " | ".join(stages)


def plan_table(plan: Plan, title: str) -> Table:
    pred = plan.predicted
    capacity = pred.get("memory_capacity_bytes")
    table = Table(title=title, title_justify="left")
    table.add_column("stage", justify="right")
    table.add_column("ranks")
    table.add_column("layers")
    table.add_column("strategies (run-length)")
    table.add_column("fwd+bwd per µbatch", justify="right")
    table.add_column("memory", justify="right")
    for stage in plan.stages:
        mem = pred["peak_memory_bytes"][stage.index]
        over = capacity is not None and mem > capacity
        ranks = f"{stage.ranks[0]}–{stage.ranks[-1]}" if len(stage.ranks) > 1 else str(stage.ranks[0])
        spans = ", ".join(str(first) if first == last else f"{first}–{last}" for first, last in stage.ranges)
        table.add_row(str(stage.index), ranks, spans, strategy_runs(plan, stage.index),
                      fmt_time(pred["stage_time_s"][stage.index]),
                      ("[red]" if over else "") + f"{mem / GB:.1f} GB")
    return table


def print_prediction(plan: Plan, title: str, console: Console | None = None) -> None:
    console = console or Console()
    pred = plan.predicted
    pipe = plan.pipeline
    console.print(plan_table(plan, title))
    chunks = f" × {plan.virtual_stages} chunks" if plan.virtual_stages > 1 else ""
    bubble = pred.get("bubble_fraction")
    console.print(f"pipeline: {pipe.degree} stage(s){chunks}, {pipe.micro_batches} micro-batch(es), "
                  f"{pipe.schedule}" + (f", idle share {bubble * 100:.1f}%" if bubble is not None else ""))
    if plan.engine is not None:
        console.print(f"engine: {plan.engine.label()}")
    console.print(f"iteration time: [bold]{fmt_time(pred['iteration_time_s'])}[/bold]   "
                  f"{pred['samples_per_s']:.2f} samples/s   {pred['tokens_per_s']:.0f} tokens/s")
    console.print(f"model TFLOP/s per device: {pred['model_tflops_per_device']:.1f}   MFU: {pred['mfu'] * 100:.1f}%")
    capacity = pred["memory_capacity_bytes"]
    worst = max(pred["peak_memory_bytes"])
    if pred["fits"]:
        console.print(f"memory: peak {worst / GB:.1f} GB of {capacity / GB:.1f} GB per device — fits")
    else:
        console.print(f"[red]memory: peak {worst / GB:.1f} GB of {capacity / GB:.0f} GB per device — does NOT fit "
                      f"(over by {(worst - capacity) / GB:.1f} GB)[/red]")
    search = plan.search
    if search:
        if search["optimal"]:
            state = "proven optimal"
        elif search.get("unbounded"):
            state = (f"not proven optimal: the time limit left {search['unbounded']} candidates unexplored "
                     "(raise --time-limit)")
        else:
            state = "not proven optimal" if search.get("gap") is None else f"gap {search['gap'] * 100:.2f}%"
        console.print(f"search: {search['solver']}, {search['candidates']} candidates, {search['time_s']:.2f} s, {state}")


def print_run(result: dict, console: Console) -> None:
    """Measured figures of `uniap run`."""
    losses = ", ".join(f"{x:.5f}" for x in result["losses"])
    console.print(f"steps: {result['steps']}   losses: {losses}")
    console.print(f"iteration time (median after warm-up): [bold]{fmt_time(result['iteration_time_s'])}[/bold]")
    console.print("stage times: " + ", ".join(fmt_time(t) for t in result["stage_time_s"]))
    console.print("peak memory per rank: " + ", ".join(f"{m / 1e6:.1f} MB" for m in result["peak_memory_bytes"]))
    if result.get("precision", "fp32") != "fp32":
        scale = result.get("loss_scale")
        note = f", loss scale {scale['final']:g} ({scale['skipped_steps']} steps skipped)" if scale else ""
        console.print(f"precision: {result['precision']} compute, fp32 master weights and gradient reduction{note}")
    check = result.get("check")
    if check:
        verdict = ""
        if "tolerance" in check:
            tol = check["tolerance"]
            verdict = (f" — {'within' if check['within_tolerance'] else 'OUTSIDE'} {result.get('precision', 'fp32')}'s "
                       f"tolerance ({tol['loss']:.1e} loss, {tol['params']:.1e} params)")
        console.print(f"check against one process: max rel loss diff {check['max_rel_loss_diff']:.2e}, "
                      f"max rel param diff {check['max_rel_param_diff']:.2e}{verdict}")
