"""`uniap` command line. Thin: parse, call the library, print. Bad input becomes one line on stderr."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from uniap.commands.options import (ATTENTION_FLAG, BATCH, CLUSTER, FMT, KERNELS_FLAG, MODEL, PREC, SCHED, SEQ, SOLVER,
                                    AttentionKernel, Fmt, Kernels, Precision, Schedule, Search, emit_json, choices,
                                    with_engine)
from uniap.commands.export import EngineName
from uniap.errors import UniapError
from uniap.planner import MAX_VIRTUAL_STAGES
from uniap.runtime.job import IMPLS, OPTIMIZERS

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the fastest way to train a transformer on a cluster (UniAP MIQP), then train it.")
out = Console()


PROFILE = typer.Option(None, "--profile", help="Cost with the figures `uniap profile` measured (default: analytic).")


Recompute = choices("Recompute", ("none", "selective", "full"))


def _workload(model_name: str, cluster_text: str, global_batch: int, seq_len: Optional[int],
              precision: Optional[Precision],
              profile: Optional[str] = None, kernels: Optional[Kernels] = None,
              attention: Optional[AttentionKernel] = None, engine: Optional[EngineName] = None):
    """`uniap.api.inputs` of the flags."""
    from uniap.api import inputs

    def value(flag):
        return None if flag is None else flag.value

    return inputs(model_name, cluster_text, global_batch, seq_len, value(precision), profile, value(kernels),
                  value(attention), value(engine))


def _print_version(value: bool) -> None:
    if value:
        from uniap import __version__

        print(f"uniap {__version__}")
        raise typer.Exit()


@app.callback()
def _global_options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                                 help="Print the version and exit.")) -> None:
    pass


@app.command()
def models(fmt: Fmt = FMT) -> None:
    """List the model zoo (published architecture figures, no weights) and the config.json model types read."""
    from uniap.spec import load_model, zoo_names
    from uniap.spec.hf import model_types

    rows = []
    for name in zoo_names():
        spec = load_model(name)
        c = spec.config
        rows.append({"name": name, "family": c.family, "layers": c.layers + c.decoder_layers, "hidden": c.hidden,
                     "heads": c.heads, "parameters": spec.parameters, "seq_len": spec.seq_len})
    types = model_types()
    if fmt is Fmt.json:
        emit_json({"models": rows, "config_model_types": types})
        return
    table = Table(title="model zoo")
    for col in ("name", "family", "layers", "hidden", "heads", "parameters", "seq_len"):
        table.add_column(col, justify="left" if col in ("name", "family") else "right")
    for r in rows:
        table.add_row(r["name"], r["family"], str(r["layers"]), str(r["hidden"]), str(r["heads"]),
                      f"{r['parameters'] / 1e9:.3f} B" if r["parameters"] >= 1e9 else f"{r['parameters'] / 1e6:.1f} M",
                      str(r["seq_len"]))
    out.print(table)
    table = Table(title="Hugging Face config.json model types (--model path/to/config.json)")
    for col in ("model_type", "family", "implies"):
        table.add_column(col)
    for r in types:
        table.add_row(r["model_type"], r["family"], r["implies"])
    out.print(table)


@app.command()
def clusters(fmt: Fmt = FMT) -> None:
    """List cluster presets; use them as PRESET:NODESxDEVICES, e.g. a100-80g:4x8."""
    from uniap.spec.cluster import DEVICE_TYPES

    rows = [{"preset": key, "device": d.name, "memory_mib": d.memory_bytes / 2**20, "memory_gb": d.memory_bytes / 1e9,
             "peak_tflops": {p: f / 1e12 for p, f in d.peak_flops.items() if f > 0},
             "intra_gbps": d.intra.bandwidth / 1e9, "inter_gbps": d.inter.bandwidth / 1e9,
             "engine": d.engine.to_json()}
            for key, d in sorted(DEVICE_TYPES.items())]
    if fmt is Fmt.json:
        emit_json({"clusters": rows})
        return
    table = Table(title="cluster presets (per device)")
    for col in ("preset", "device", "memory", "peak TFLOP/s", "intra-node GB/s", "inter-node GB/s", "default engine"):
        table.add_column(col)
    for r in rows:
        peaks = ", ".join(f"{p} {v:g}" for p, v in r["peak_tflops"].items())
        table.add_row(r["preset"], r["device"], f"{r['memory_mib']:,.0f} MiB", peaks, f"{r['intra_gbps']:g}",
                      f"{r['inter_gbps']:g}", f"{r['engine']['kernels']}, {r['engine']['attention']}")
    out.print(table)


@app.command()
def estimate(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Zoo name or Hugging Face config.json."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="PRESET:NODESxDEVICES or a YAML file."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b", help="Samples per iteration."),
    seq_len: Optional[int] = SEQ,
    precision: Optional[Precision] = PREC,
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel degree (default: devices / (tp·pp))."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0–3 over the dp group."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Samples per device per micro-batch (default 1)."),
    micro_batches: Optional[int] = typer.Option(None, "--micro-batches", help="Micro-batches per iteration (instead of --micro-batch-size)."),
    recompute: Recompute = typer.Option(Recompute.none, "--recompute", help="Activation recomputation of the blocks."),
    schedule: Schedule = SCHED,
    virtual_stages: int = typer.Option(1, "--virtual-stages", help="Chunks per pipeline stage for --schedule "
                                       "interleaved-1f1b (at least 2) or zero-bubble (1 is ZB-H1)."),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel", help="Megatron sequence parallelism (tp > 1)."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree of the MoE blocks' routed experts (divides "
                           "dp·tp and the experts)."),
    etp: int = typer.Option(1, "--etp", help="Expert tensor-parallel degree (splits each routed expert)."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree: each sequence split cp ways (load-balanced)."),
    plan: Optional[str] = typer.Option(None, "--plan", help="Re-cost a plan file instead of a uniform configuration."),
    profile: Optional[str] = PROFILE,
    kernels: Optional[Kernels] = KERNELS_FLAG,
    attention: Optional[AttentionKernel] = ATTENTION_FLAG,
    fmt: Fmt = FMT,
) -> None:
    """Cost a hand-written uniform configuration (tp/pp/dp/ZeRO/micro-batches), or re-cost a plan file."""
    from dataclasses import replace

    from uniap.estimate import cost_plan, estimate_uniform, predict, workload_of
    from uniap.plans import Plan
    from uniap.spec.cluster import load_cluster
    from uniap.views import print_prediction

    if plan is not None:
        result = Plan.load(plan)
        spec = _model_from_plan(result)
        clus = load_cluster(cluster or result.cluster.name)
        clus = replace(clus, engine=result.engine_or(clus.engine))
        clus = with_engine(clus, kernels, attention)
        if profile is not None:
            from uniap.profile import calibrate

            clus = calibrate(clus, profile, model=spec, workload=workload_of(result))
        if clus.devices != result.world_size:
            raise UniapError(f"plan is for {result.world_size} devices but cluster {clus.name} has {clus.devices}")
        program, stage_of, strategy_of = cost_plan(result, spec, clus)
        result = replace(result, predicted=predict(spec, clus, workload_of(result), program, stage_of, strategy_of))
    else:
        missing = [flag for flag, v in (("--model", model), ("--cluster", cluster), ("--global-batch", global_batch))
                   if v is None]
        if missing:
            raise UniapError(f"estimate needs {', '.join(missing)} (or --plan)")
        spec, clus, workload = _workload(model, cluster, global_batch, seq_len, precision, profile, kernels,
                                         attention)
        result = estimate_uniform(spec, clus, workload, tp=tp, pp=pp, dp=dp, zero=zero,
                                  micro_batch_size=micro_batch_size, micro_batches=micro_batches,
                                  recompute=recompute.value, sequence_parallel=sequence_parallel,
                                  schedule=schedule.value, virtual_stages=virtual_stages, ep=ep, etp=etp,
                                  cp=cp)
    if profile is not None:
        from uniap.intervals import with_interval

        result = with_interval(result, spec, clus, profile)
    elif result.interval is not None:  # re-costed without a profile: the old interval no longer applies
        result = replace(result, interval=None)
    if fmt is Fmt.json:
        emit_json(result.to_json())
    else:
        print_prediction(result, f"{result.model.name} on {result.cluster.name}")
        if profile is not None:
            _print_interval(result)


def _print_interval(result) -> None:
    from uniap.intervals import NO_INTERVAL, interval_line

    out.print(interval_line(result) or NO_INTERVAL, highlight=False)


def _print_runner_ups(found: list, complete: bool) -> None:
    """The runner-ups of `plan --profile`: the ties first (inside the chosen plan's interval), then the others."""
    from uniap.views import describe

    ties = [r for r in found if r.tie]
    out.print(f"runner-ups (the best plan of each other pipeline configuration): {len(ties)} inside the chosen "
              f"plan's interval" + ("" if complete else " (search time ran out: the list is partial)"))
    for r in found[:max(len(ties), 3)]:
        iv = r.plan.interval
        span = f", interval {iv.low_s * 1e3:.4g}–{iv.high_s * 1e3:.4g} ms" if iv is not None else ""
        mark = "TIE " if r.tie else "    "
        out.print(f"  {mark}{r.slower * 100:+5.1f}%  {float(r.plan.predicted['iteration_time_s']) * 1e3:.4g} ms"
                  f"{span}  {describe(r.plan)}", highlight=False)
    if ties:
        out.print("  TIE: predicted inside the chosen plan's interval — the prediction cannot tell which is faster",
                  highlight=False)


@app.command()
def plan(
    model: str = MODEL,
    cluster: str = CLUSTER,
    global_batch: int = BATCH,
    seq_len: Optional[int] = SEQ,
    precision: Optional[Precision] = PREC,
    schedule: Search = typer.Option(Search["default"], "--schedule", help="Pipeline schedules searched: default "
                                    "(or all) searches 1f1b, interleaved-1f1b, zero-bubble and the V schedules "
                                    "(zero-bubble-v, dualpipe-v) together; interleaved-1f1b searches it with 1f1b; "
                                    "a schedule's name that schedule alone."),
    max_virtual_stages: int = typer.Option(MAX_VIRTUAL_STAGES, "--max-virtual-stages", help="Most chunks per stage "
                                           "the interleaved search tries."),
    solver: str = SOLVER,
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Seconds for the whole search; the best plan found so far is returned with its gap."),
    max_tp: Optional[int] = typer.Option(None, "--max-tp", help="Largest tensor-parallel degree to consider."),
    max_cp: Optional[int] = typer.Option(None, "--max-cp", help="Largest context-parallel degree to consider (cp is "
                                         "searched where each rank keeps at least 4,096 tokens of a sequence)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Candidates solved in parallel (default: cores, at most 2)."),
    out_path: Optional[str] = typer.Option(None, "--out", "-o", help="Write the plan JSON here."),
    engine: Optional[EngineName] = typer.Option(None, "--engine", help="Only plans this engine can run "
                                                "(`uniap export --to` it), and how much slower than the free optimum."),
    profile: Optional[str] = PROFILE,
    kernels: Optional[Kernels] = KERNELS_FLAG,
    attention: Optional[AttentionKernel] = ATTENTION_FLAG,
    fmt: Fmt = FMT,
) -> None:
    """Find the fastest plan: one MIQP per pipeline configuration chooses stages and per-layer strategies together."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from uniap.planner import plan_search
    from uniap.views import print_prediction

    spec, clus, workload = _workload(model, cluster, global_batch, seq_len, precision, profile, kernels, attention,
                                     engine)
    err = Console(stderr=True)
    with Progress(TextColumn("[bold]searching"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[best]}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task("search", total=None, best="")

        def progress(done: int, total: int, best: float) -> None:
            best_text = f"best {best:.4g} s/iter" if best < float("inf") else "no plan yet"
            bar.update(task, completed=done, total=total, best=best_text)

        if engine is None:
            result = plan_search(spec, clus, workload, schedule=schedule.value, solver=solver,
                                 time_limit=time_limit, max_tp=max_tp, workers=workers,
                                 max_virtual_stages=max_virtual_stages, progress=progress, max_cp=max_cp)
        else:
            from uniap.engine_search import engine_plan_search
            from uniap.export import engine_rules

            result = engine_plan_search(spec, clus, workload, engine_rules(engine.value), schedule=schedule.value,
                                        solver=solver, time_limit=time_limit, max_tp=max_tp, workers=workers,
                                        max_virtual_stages=max_virtual_stages).plan
    found = None
    if profile is not None:
        result, found, complete = _with_runner_ups(result, spec, clus, workload, profile, schedule.value, solver,
                                                   max_tp, max_cp, max_virtual_stages, time_limit)
    if out_path:
        result.save(out_path)
    if fmt is Fmt.json:
        emit_json(result.to_json())
    else:
        print_prediction(result, f"uniap plan: {spec.name} on {clus.name}" + (f" for {engine.value}" if engine else ""))
        if profile is not None:
            _print_interval(result)
            if result.search.get("search_ranked_first"):
                out.print(f"the search returned {result.search['search_ranked_first']}; solved alone and priced by "
                          f"its own stage times, the plan above is faster", highlight=False)
            _print_runner_ups(found, complete)
        if engine is not None:
            slowdown = result.search["slowdown"]  # < 0 only where a plan's own stages price it under the free one's
            out.print(f"engine-restricted plan is {100 * abs(slowdown):.1f}% {'slower' if slowdown >= 0 else 'faster'} "
                      f"than the free optimum "
                      f"({result.search['free_iteration_time_s']:.4g} s per iteration)")
        if out_path:
            out.print(f"plan written to {out_path}")


Optimizer = choices("Optimizer", OPTIMIZERS)
Impl = choices("Impl", IMPLS)


@app.command()
def run(
    plan_path: str = typer.Option(..., "--plan", "-p", help="Plan file (from `uniap plan`, `estimate --format json`, or by hand)."),
    steps: int = typer.Option(3, "--steps", help="Training steps (total, also when resuming)."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Spawn torchrun with this many ranks on this machine (default: the plan's world, or torchrun's)."),
    nnodes: int = typer.Option(1, "--nnodes", help="Machines taking part; run the same command on each (with --node-rank, --rdzv-endpoint)."),
    node_rank: int = typer.Option(0, "--node-rank", help="This machine's index, 0 .. nnodes − 1; node 0 is the one at --rdzv-endpoint."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", help="HOST:PORT of node 0 for torchrun's c10d rendezvous."),
    check: bool = typer.Option(False, "--check", help="Also train in one process and report the largest relative differences."),
    data: Optional[str] = typer.Option(None, "--data", help="Text file to train on (bytes as tokens); default: seeded synthetic tokens."),
    seed: int = typer.Option(0, "--seed"),
    lr: float = typer.Option(1e-3, "--lr"),
    optimizer: Optimizer = typer.Option(Optimizer.sgd, "--optimizer", help="sgd (momentum 0.9) or adamw."),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Save torch.distributed.checkpoint here."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Save every K steps (0: never)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last complete checkpoint (any plan of the same model)."),
    impl: Impl = typer.Option(Impl.uniap, "--impl", help="The model trained: uniap (our decoder) or transformers "
                              "(the class of the model's Hugging Face config; pip install 'uniap[hf]')."),
    meter_every_step: bool = typer.Option(False, "--meter-every-step", help="Meter saved activations on every step (default: the first, untimed one)."),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Seconds a collective may wait before the run is failed."),
    fmt: Fmt = FMT,
) -> None:
    """Train a plan on PyTorch distributed (gloo on CPU, NCCL on GPU) and report measured figures."""
    from uniap.runtime.job import TrainingJob
    from uniap.runtime.launch import run_many
    from uniap.runtime.launcher import Nodes

    if steps < 1:
        raise UniapError(f"--steps must be >= 1, got {steps}")
    nodes = None
    if nnodes > 1 or node_rank != 0 or rdzv_endpoint is not None:
        if nproc is None:
            raise UniapError("a several-machine run needs --nproc (ranks per machine)")
        nodes = Nodes(nproc, nnodes, node_rank, rdzv_endpoint)
    job = TrainingJob(plan_path, steps=steps, check=check, data=data, seed=seed, lr=lr, optimizer=optimizer.value,
                      checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume,
                      meter_every_step=meter_every_step, impl=impl.value)
    result = run_many([job], nproc=None if nodes else nproc, timeout_s=timeout_s, nodes=nodes)[0]
    if result is None:
        out.print(f"node {node_rank}: done; the node that ran rank 0 reports the results")
        return
    against = _against_interval(plan_path, result)
    if fmt is Fmt.json:
        keys = ("steps", "losses", "iteration_time_s", "stage_time_s", "peak_memory_bytes", "check")
        emit_json({**{k: result[k] for k in keys}, **{k: v for k, v in result.items() if k not in keys},
                   "against_interval": against})
        return
    from uniap.views import print_run

    print_run(result, out)
    if against:
        out.print(against, highlight=False)


def _against_interval(plan_path: str, result: dict) -> str | None:
    """`uniap run`'s measured iteration time against the plan's interval (None: the plan has none)."""
    from uniap.plans import Plan
    from uniap.intervals import measured_against

    return measured_against(Plan.load(plan_path), float(result["iteration_time_s"]))


def _with_runner_ups(result, spec, clus, workload, profile, schedule, solver, max_tp, max_cp, max_virtual_stages,
                     time_limit):
    """The chosen plan with its interval, and the runner-ups (also recorded in its `search` facts)."""
    from dataclasses import replace

    from uniap.profile.calibration import profile_of
    from uniap.intervals import Intervals
    from uniap.runnerups import runner_ups
    from uniap.views import describe

    intervals = Intervals(clus, profile_of(clus), spec, workload, profile)
    result = intervals.attach(result)
    result, found, complete = runner_ups(spec, clus, workload, result, intervals, schedule=schedule,
                                         solver=solver, max_tp=max_tp, max_cp=max_cp,
                                         max_virtual_stages=max_virtual_stages, time_limit=time_limit or 60.0)
    listed = [{"plan": describe(r.plan), "iteration_time_s": float(r.plan.predicted["iteration_time_s"]),
               "interval_s": None if r.plan.interval is None else [r.plan.interval.low_s, r.plan.interval.high_s],
               "slower": r.slower, "tie": r.tie} for r in found]
    search = dict(result.search or {}, runner_ups=listed, runner_ups_complete=complete)
    return replace(result, search=search), found, complete


def _model_from_plan(plan):
    """The model a plan was made for, rebuilt from the architecture it carries."""
    from uniap.spec.families import build_layers

    return build_layers(plan.model_config(), int(plan.model.seq_len))


def _register_commands() -> None:
    """Commands that live in their own modules (one concern per file)."""
    from uniap.commands.compare import compare_command
    from uniap.commands.demo import demo_command
    from uniap.commands.export import export_command
    from uniap.commands.profile import profile_command
    from uniap.commands.report import report_command

    app.command("compare", help="Compare uniap with baseline planners (Megatron grid, Galvatron, Alpa, DP, ZeRO-3) "
                "on the same cost model.")(compare_command)
    app.command("report", help="Render a plan (and optionally a run) as a static HTML report with images.")(report_command)
    app.command("export", help="Write a plan as a torchtitan job TOML, Megatron-LM launch flags or a DeepSpeed "
                "config JSON.")(export_command)
    app.command("profile", help="Measure layer times per strategy and collective α–β on local ranks (for --profile)."
                )(profile_command)
    app.command("demo", help="The end-to-end demo: profile a small GPT on 4 local ranks, plan it, run the chosen "
                "plan and others, compare predicted with measured.")(demo_command)


_register_commands()


def main() -> None:
    """Console entry point: typer handles usage errors itself; our input errors become one line."""
    try:
        app()
    except UniapError as exc:
        print(f"uniap: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("uniap: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
