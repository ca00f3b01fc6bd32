"""`uniap demo`: profile a small GPT on local ranks, plan it with the calibrated cost model, run the chosen plan
and a spread of hand-written ones, and compare predicted with measured.

    result = run_demo(out_dir="out/demo", nproc=4)

Steps (all on this machine, ~8 minutes on 2 CPU cores):
  1. profile the demo model on `nproc` local ranks (`uniap profile`; gloo on CPU, NCCL on CUDA), first pass;
  2. calibrate the local cluster with it and search the best plan (UniAP MIQP over every pipeline configuration);
  3. the chosen plan and ~12 others (uniform DP, ZeRO-3, TP, dp×tp, recompute, pp=2 and pp=4 variants,
     mixed per-layer plans);
  4. run them all, `rounds` torchrun launches (`runtime.run_many`) of `steps` steps each, median step after
     each run's first two; the profile's further passes are measured between the rounds;
  5. cost every plan with the whole profile and report per plan predicted and measured iteration time and
     memory, the median absolute relative error, Kendall τ between predicted and measured order, the chosen
     plan's regret and whether the whole profile would have chosen the same plan.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from uniap.errors import UniapError
from uniap.spec.model import ModelConfig
from uniap.spec.hf import zoo_hf_config
from uniap.strategies import Strategy as S

# The demo model: GPT-2 architecture, 4 blocks of hidden 256 (4 heads, FFN 1024), vocabulary 1024, 64 tokens;
# ~4 M parameters. tiny-gpt (hidden 128) is so small that fixed per-call costs swamp every difference between
# plans; at hidden 256 a block's compute is a few ms per sample, large enough to rank plans, small enough
# that profiling and 13 runs fit in a few minutes on 2 cores.
DEMO_MODEL = ModelConfig(name="demo-gpt", family="gpt2", layers=4, hidden=256, heads=4, ffn=1024, vocab=1024,
                         max_seq=64, tied_embeddings=False)
DEMO_SEQ = 64
DEMO_BATCH = 16
WARMUP_STEPS = 2
"""Steps of each run left out of its measured time: the second step of a plan that re-lays out activations or
uses DTensor is still ~10-30 % slower than the later ones (first calls of collectives and sharding rules)."""


def local_cluster(nproc: int):
    """The ranks of this host as a ClusterSpec: `cpu:1xN` on CPU; on CUDA the local GPUs (memory from the driver,
    the other figures from the A100 preset until `calibrate` replaces them with measured ones)."""
    from uniap.spec.cluster import DEVICE_TYPES, ClusterSpec, load_cluster

    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        cuda = False
    if not cuda:
        return load_cluster(f"cpu:1x{nproc}")
    if torch.cuda.device_count() < nproc:
        raise UniapError(f"{nproc} ranks asked but only {torch.cuda.device_count()} GPUs are visible")
    props = torch.cuda.get_device_properties(0)
    device = replace(DEVICE_TYPES["a100-80g"], name=props.name, memory_bytes=float(props.total_memory))
    return ClusterSpec(name=f"local-cuda:1x{nproc}", nodes=1, devices_per_node=nproc, device=device)


def comparison_plans(config: ModelConfig, world: int, global_batch: int, seq_len: int,
                     engine: dict | None = None) -> dict:
    """Hand-written plans spanning the space: name -> Plan (runtime.plans.uniform_plan).

    `engine`: the cluster's engine entry, recorded in every plan so that the runtime runs the attention kernel
    the predictions price (a plan without one runs flash, which keeps no score matrix)."""
    from uniap.runtime.checks import check_plan
    from uniap.runtime.plans import uniform_plan

    L = config.layers
    kw = dict(global_batch=global_batch, seq_len=seq_len, precision="fp32", engine=engine)
    out = {}

    def add(name, **args):
        pieces = args.get("pp", 1) * args.get("virtual_stages", 1)  # stages, or chunks when interleaved
        try:
            split = megatron_split(config, seq_len, pieces)
            plan = uniform_plan(config, world, stage_layers=split, **{**kw, **args})
            check_plan(plan, world)  # e.g. a micro-batch too small for the plan's dp
            out[name] = plan
        except UniapError:
            pass  # not expressible on this world size / model (e.g. tp not dividing heads)

    half = max(world // 2, 1)
    add(f"dp{world}", dp=world)
    add(f"dp{world}·z3", dp=world, zero=3)
    add(f"dp{world}·rc", dp=world, recompute=True,  # embed and head are not recomputed
        per_layer={"embed": S(world, 1), "head": S(world, 1)})
    add(f"dp{world} c=4", dp=world, micro_batches=4)
    add(f"tp{world}", tp=world)
    if world >= 4:
        add(f"dp{half}·tp2", dp=half, tp=2)
    if world >= 2:
        add(f"pp2·dp{half} c=4", pp=2, dp=half, micro_batches=4)
        add(f"pp2·tp{half} c=4", pp=2, tp=half, micro_batches=4)
        add(f"pp2·v2·dp{half} c=4", pp=2, dp=half, micro_batches=4, schedule="interleaved-1f1b", virtual_stages=2)
        add("pp2 mixed c=4", pp=2, dp=half, micro_batches=4,
            per_layer={f"block.{i}": S(1, half) for i in range(L // 2, L)} | {"head": S(1, half)})
        # Megatron's split puts embed + blocks 0..L/2-1 on stage 0, the rest + head on stage 1
    if world >= 4:
        add("pp4 c=8", pp=4, micro_batches=8)
        add("pp4 gpipe c=4", pp=4, micro_batches=4, schedule="gpipe")
    # One stage, a different strategy per layer (DTensor re-layouts between them).
    mixed = {"embed": S(world, 1, 0), "head": S(1, world)}
    for i in range(L):
        mixed[f"block.{i}"] = S(world, 1, 3) if i % 2 else S(half, world // half)
    add("mixed 1 stage", dp=world, per_layer=mixed)
    return out


def megatron_split(config: ModelConfig, seq_len: int, pp: int) -> list[int]:
    """Layers per stage (or chunk) as Megatron splits them (blocks evenly, embedding on the first, head on the
    last)."""
    from uniap.estimate import uniform_split
    from uniap.spec.families import build_layers

    stage_of = uniform_split(build_layers(config, seq_len), pp)
    return [int((stage_of == i).sum()) for i in range(pp)]


def predict_plan(plan, model, cluster) -> dict:
    """The plan's `predicted` section under `cluster`'s cost model (the same numbers `estimate --plan` gives)."""
    from uniap.estimate import cost_plan, predict, workload_of

    program, stage_of, strategy_of = cost_plan(plan, model, cluster)
    return predict(model, cluster, workload_of(plan), program, stage_of, strategy_of)


def kendall_tau(x, y) -> float:
    """Kendall's τ-b (ties counted as neither concordant nor discordant); 1.0 for fewer than 2 items."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif dx == dy:
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + tx) * (conc + disc + ty))
    return float((conc - disc) / denom) if denom > 0 else 1.0


def ranks(values) -> list[int]:
    """1 = smallest."""
    order = np.argsort(np.asarray(values, dtype=float), kind="stable")
    out = [0] * len(order)
    for r, i in enumerate(order):
        out[int(i)] = r + 1
    return out


def statistics(rows: list[dict]) -> dict:
    pred = [r["predicted_s"] for r in rows]
    meas = [r["measured_s"] for r in rows]
    errs = [abs(r["error"]) for r in rows]
    chosen = [r for r in rows if r.get("chosen")]
    best = min(meas)
    mem = [abs(r["memory_error"]) for r in rows if r.get("memory_error") is not None]
    return {
        "median_abs_rel_error": float(np.median(errs)),
        "kendall_tau": kendall_tau(pred, meas),
        "regret": (chosen[0]["measured_s"] / best - 1.0) if chosen else None,
        "memory_median_abs_rel_error": float(np.median(mem)) if mem else None,
        "memory_max_abs_rel_error": float(np.max(mem)) if mem else None,
        "round_spread": round_spread(rows),
    }


def round_spread(rows: list[dict]) -> float | None:
    """Median over the plans of max/min − 1 of a plan's measured time in each round (one launch per plan, minutes
    after the last; the warm-up steps left out): how far this run's own measurements of one plan disagree. No
    profile sees it, so it is the floor under the run's errors. A neighbour on the host that the machine's own
    process counts cannot see shows here: on 7 December the demo GPT's rounds differed by 4–6 % in the morning and
    by 15–25 % in the afternoon and evening. None with a single round."""
    spreads = []
    for row in rows:
        rounds = [float(np.median(times[WARMUP_STEPS:])) for times in row.get("step_times_s") or []
                  if len(times) > WARMUP_STEPS]
        if len(rounds) > 1:
            spreads.append(max(rounds) / min(rounds) - 1.0)
    return float(np.median(spreads)) if spreads else None


def run_demo(out_dir: str | Path = "out/demo", *, nproc: int | None = None, steps: int = 8, rounds: int = 3, reps: int = 3,
             passes: int = 3,
             warmup: int = 2, micro_batch_sizes=(1, 4, 16), rep_seconds: float = 0.05,
             config: ModelConfig = DEMO_MODEL, seq_len: int = DEMO_SEQ, global_batch: int = DEMO_BATCH,
             profile_path: str | Path | None = None, solver: str = "highs", time_limit: float | None = 60.0,
             comparisons: int | None = None, timeout_s: float = 120.0, progress=None, say=None) -> dict:
    """Profile → plan → run → compare. Returns the result dict (also written to OUT_DIR/demo.json).

    Profile: `passes` passes (spread over the rounds, `passes_before_rounds`) of `reps` repetitions per figure at `micro_batch_sizes` samples per dp shard (they
    should span the plans' micro-batches: lines are fitted through them). profile_path: reuse an existing profile
    instead of measuring one. comparisons: run only the first N hand-written plans that differ from the chosen
    one. progress(done, total, what) reports the profiling; say(text) the stages.
    """
    from uniap.planner import plan_search
    from uniap.profile.calibration import calibrate
    from uniap.profile.collect import Profiling, default_nproc
    from uniap.profile.schema import load_profile
    from uniap.runtime.job import TrainingJob
    from uniap.spec.families import build_layers
    from uniap.spec.workload import Workload

    say = say or (lambda text: None)
    nproc = default_nproc() if nproc is None else int(nproc)
    _check_inputs(nproc, steps, rounds, config, seq_len, time_limit)
    chunks = passes_before_rounds(passes, rounds) if profile_path is None else [0] * rounds
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model = build_layers(config, seq_len)
    workload = Workload(global_batch, seq_len, "fp32")
    _write_hf_config(config, out)
    cluster = local_cluster(nproc)
    timings = {}

    t0 = time.perf_counter()
    profiling = None
    if profile_path is None:  # measured in launches between the rounds of runs (`passes_before_rounds`)
        profiling = Profiling(config, seq_len, nproc, micro_batch_sizes=micro_batch_sizes, reps=reps, warmup=warmup,
                              rep_seconds=rep_seconds, timeout_s=timeout_s)
        profile_path = out / "profile.json"
        doc = _profile_more(profiling, chunks[0], passes, profile_path, say, progress)
    else:
        doc = load_profile(profile_path)
    timings["profile_s"] = time.perf_counter() - t0
    calibrated = calibrate(cluster, doc, model=model, workload=workload)

    t0 = time.perf_counter()
    planned_with = _passes_named(chunks[0]) if profiling is not None else "the given profile"
    say(f"planning with the calibrated cost model ({planned_with})")

    def search(costed):
        return plan_search(model, costed, workload, schedule="1f1b", solver=solver, time_limit=time_limit, workers=1)

    chosen = search(calibrated)
    timings["plan_s"] = time.perf_counter() - t0
    chosen.save(out / "plan.json")

    plans = _plans_to_run(chosen, comparison_plans(config, nproc, global_batch, seq_len, cluster.engine.to_json()),
                          comparisons)
    plan_dir = out / "plans"
    plan_dir.mkdir(exist_ok=True)
    paths = [str(plan_dir / f"{i:02d}.json") for i in range(len(plans))]

    def predict_all(costed) -> dict:  # what the runs compare with, also in each plan file
        predicted = {name: replace(plan, predicted=predict_plan(plan, model, costed)) for name, plan in plans.items()}
        for plan, path in zip(predicted.values(), paths):
            plan.save(path)
        return predicted

    plans = predict_all(calibrated)
    # Rounds: every plan runs `steps` steps, then every plan again, ... — a slow spell of the machine then
    # touches every plan a little instead of a few plans a lot. One launch per round: the runtime keeps every
    # job's process groups alive until its launch ends, and later jobs of a long launch run a few % slower.
    # The profile's later passes run between the rounds, so that profile and runs sample the same stretch of
    # a shared machine (its speed drifts by 10-20 % over minutes: README, "Predicted against measured").
    say(f"running {len(paths)} plans × {steps} steps, {rounds} round(s) of one launch each")
    jobs = [TrainingJob(path, steps=steps) for path in paths]
    results, doc, profile_error = _rounds(jobs, rounds, chunks, profiling, passes, profile_path, doc, nproc,
                                          timeout_s, timings, say, progress)
    whole_choice = None  # what a search with the whole profile picks, when it holds more than the plan saw
    if profiling is not None and profiling.passes > chunks[0]:
        t0 = time.perf_counter()
        say(f"predicting with the whole profile ({profiling.passes} passes) and searching with it again")
        calibrated = calibrate(cluster, doc, model=model, workload=workload)
        plans = predict_all(calibrated)
        whole_choice = search(calibrated)
        timings["plan_s"] += time.perf_counter() - t0

    rows = _rows(plans, results, calibrated.device.reserve_bytes)
    timings["total_s"] = time.perf_counter() - started
    result = _summary(rows, config, model, cluster, global_batch, steps, rounds, profile_path, out, chosen, timings,
                      planned_with, profile_error, whole_choice)
    score_intervals(result, out)
    png = out / "predicted_vs_measured.png"
    draw(result, png)
    result["figure"] = str(png)
    (out / "demo.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _summary(rows, config, model, cluster, global_batch, steps, rounds, profile_path, out, chosen, timings,
             planned_with, profile_error, whole_choice) -> dict:
    """The demo's result dict (demo.json): the rows, their statistics and how they were measured."""
    from uniap.views import describe

    result = {"rows": rows, **statistics(rows)}
    result.update({
        "model": {"name": config.name, "config": config.to_json(), "seq_len": model.seq_len, "parameters": model.parameters},
        "cluster": cluster.name, "global_batch": global_batch, "steps": steps, "rounds": rounds,
        "statistic": f"measured: median over rounds of the step times after each run's first {WARMUP_STEPS} "
                     f"steps (a step's time is the slowest rank's)",
        "profile": str(profile_path), "chosen_plan": str(out / "plan.json"),
        "search": chosen.search, "timings_s": timings,
        "planned_with": planned_with, "profile_error": profile_error,
        "whole_profile_chooses_the_same_plan": (None if whole_choice is None
                                                else _assignment_key(whole_choice) == _assignment_key(chosen)),
        "whole_profile_plan": None if whole_choice is None else describe(whole_choice),
    })
    return result


def score_intervals(result: dict, out_dir: str | Path, *, repredict: bool = False) -> dict:
    """What the profile's spread says of the demo's predictions (`uniap.profile.uncertainty`), added to `result`:
    per row its interval (`interval_s`, around its prediction) and whether the measured time fell inside; the
    share inside (`inside_interval`); per class of plan (one layout, relayout) the model error the intervals hold
    (`model_error_used`, fitted on other runs) and the one these rows alone would fit (`model_error_here`,
    `fit_model_error`); and `by_passes`: the median error and τ had every plan been costed with the profile's
    first k passes only (k = 1 .. passes), the figures `uniap profile --passes`'s default rests on. `repredict`: cost every row again with the whole profile
    under the checked-out cost model first (its prediction, error, ranks and the statistics), to re-score old runs.
    Nothing is measured: it reads OUT_DIR/profile.json and OUT_DIR/plans/*.json (the rows' order)."""
    from uniap.plans import Plan
    from uniap.profile.calibration import calibrate
    from uniap.profile.schema import load_profile
    from uniap.intervals import Intervals, predicted_time
    from uniap.profile.uncertainty import CLASSES, first_passes, fit_classes, model_error_of, relays_out
    from uniap.spec.families import build_layers
    from uniap.spec.workload import Workload

    out = Path(out_dir)
    doc = load_profile(out / "profile.json")
    config = ModelConfig(**result["model"]["config"])
    model = build_layers(config, int(result["model"]["seq_len"]))
    workload = Workload(int(result["global_batch"]), model.seq_len, "fp32")
    cluster = local_cluster(int(doc["world_size"]))
    plans = [Plan.load(path) for path in sorted((out / "plans").glob("*.json"))]
    if len(plans) != len(result["rows"]):
        raise UniapError(f"{out / 'plans'} holds {len(plans)} plans but the result {len(result['rows'])} rows")
    if repredict:
        whole = calibrate(cluster, doc, model=model, workload=workload)
        for row, plan in zip(result["rows"], plans):
            row["predicted_s"] = predicted_time(plan, model, whole)
            row["error"] = (row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        for r, rank in zip(result["rows"], ranks([r["predicted_s"] for r in result["rows"]])):
            r["predicted_rank"] = rank
        result.update(statistics(result["rows"]))
    intervals = Intervals(cluster, doc, model, workload, str(out / "profile.json"))
    inside = []
    for row, plan in zip(result["rows"], plans):
        row["relayout"] = relays_out(plan)
        iv = intervals.of(plan, center=row["predicted_s"])
        if iv is None:
            continue
        row["interval_s"] = [iv.low_s, iv.high_s]
        row["interval_replicate_s"] = list(iv.replicate_s)
        row["inside"] = bool(iv.low_s <= row["measured_s"] <= iv.high_s)
        inside.append(row["inside"])
        result["interval_method"] = iv.method
    result["inside_interval"] = sum(inside) / len(inside) if inside else None
    used = {name: model_error_of(intervals.device, relayout) for relayout, name in CLASSES.items()}
    result["model_error_used"] = {name: e.sigma if e is not None else None for name, e in used.items()}
    runs = [{"predicted_s": row["predicted_s"], "measured_s": row["measured_s"], "relayout": row["relayout"],
             "replicate_s": row["interval_replicate_s"]} for row in result["rows"] if "interval_replicate_s" in row]
    result["model_error_here"] = fit_classes(runs)
    measured = [row["measured_s"] for row in result["rows"]]
    by_passes = {}
    for k in range(1, int(doc["method"].get("passes", 1)) + 1 if intervals.kind != "none" else 1):
        costed = calibrate(cluster, first_passes(doc, k), model=model, workload=workload)
        predicted = [predicted_time(plan, model, costed) for plan in plans]
        errors = [abs(p - m) / m for p, m in zip(predicted, measured)]
        by_passes[str(k)] = {"median_abs_rel_error": float(np.median(errors)),
                             "kendall_tau": kendall_tau(predicted, measured)}
    result["by_passes"] = by_passes
    return result


def _check_inputs(nproc: int, steps: int, rounds: int, config: ModelConfig, seq_len: int,
                  time_limit: float | None) -> None:
    """One line, before anything is spawned, for counts out of range or a model the runtime cannot train."""
    from uniap.models.decoder import check_supported
    from uniap.planner import check_time_limit

    check_supported(config)
    check_time_limit(time_limit)
    if config.learned_positions and seq_len > config.max_seq:
        raise UniapError(f"--seq-len {seq_len} exceeds {config.name}'s {config.max_seq} learned positions")
    if nproc < 1:
        raise UniapError(f"--nproc must be >= 1, got {nproc}")
    if steps <= WARMUP_STEPS:
        raise UniapError(f"--steps must be > {WARMUP_STEPS} (the first {WARMUP_STEPS} are a warm-up), got {steps}")
    if rounds < 1:
        raise UniapError(f"--rounds must be >= 1, got {rounds}")


def _write_hf_config(config: ModelConfig, out: Path) -> None:
    """OUT/config.json, so that `uniap plan --model OUT/config.json --profile OUT/profile.json` plans this model
    (nothing for an architecture no Hugging Face GPT-2 or Llama config expresses)."""
    try:
        (out / "config.json").write_text(json.dumps(zoo_hf_config(config), indent=1) + "\n")
    except UniapError:
        pass


def _rounds(jobs, rounds: int, chunks: list[int], profiling, passes: int, profile_path, doc: dict, nproc: int,
            timeout_s: float, timings: dict, say, progress) -> tuple[list[dict], dict, str | None]:
    """Run every plan in each of `rounds` launches, measuring the profile's next passes between them (`chunks`);
    returns the runs' results (round after round), the profile as it then stands, and why profiling stopped
    early, if it did (the rounds go on, predicting with the passes measured). Adds to timings' profile_s and
    run_s."""
    from uniap.runtime.launch import run_many

    results, profile_error = [], None
    timings["run_s"] = 0.0
    for r in range(rounds):
        if r > 0 and chunks[r] and profile_error is None:
            t0 = time.perf_counter()
            try:
                doc = _profile_more(profiling, chunks[r], passes, profile_path, say, progress)
            except UniapError as exc:
                profile_error = str(exc)
                say(f"profiling stopped ({exc}); predicting with the passes measured so far")
            timings["profile_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        results += run_many(jobs, nproc=nproc, timeout_s=timeout_s)
        timings["run_s"] += time.perf_counter() - t0
    return results, doc, profile_error


def _plans_to_run(chosen, hand: dict, comparisons: int | None) -> dict:
    """The chosen plan and the hand-written ones that differ from it (and from each other), the first
    `comparisons` of them when given."""
    plans = {"uniap (chosen)": chosen}
    seen = {_assignment_key(chosen)}
    for name, plan in hand.items():
        if comparisons is not None and len(plans) > comparisons:
            break
        key = _assignment_key(plan)
        if key not in seen:
            seen.add(key)
            plans[name] = plan
    return plans


def _rows(plans: dict, results: list[dict], reserve: float) -> list[dict]:
    """One row per plan: predicted against measured time and memory over the rounds (results: the rounds' run
    results, plan after plan), and both ranks."""
    from uniap.views import describe

    rows = []
    for i, (name, plan) in enumerate(plans.items()):
        runs = results[i::len(plans)]
        timed = [t for res in runs for t in res["step_times_s"][WARMUP_STEPS:]]
        pred_s = float(plan.predicted["iteration_time_s"])
        meas_s = float(np.median(timed))
        pred_mem = max(plan.predicted["peak_memory_bytes"]) - reserve  # the runtime's account has no reserve
        meas_mem = max(max(res["peak_memory_bytes"]) for res in runs)
        rows.append({
            "plan": name, "chosen": name == "uniap (chosen)", "description": describe(plan),
            "predicted_s": pred_s, "measured_s": meas_s, "error": (pred_s - meas_s) / meas_s,
            "step_times_s": [res["step_times_s"] for res in runs],
            "predicted_stage_s": plan.predicted["stage_time_s"],
            "measured_stage_s": [res["stage_time_s"] for res in runs],
            "predicted_memory_bytes": int(pred_mem), "measured_memory_bytes": int(meas_mem),
            "memory_error": (pred_mem - meas_mem) / meas_mem if meas_mem > 0 else None,
            "memory_method": runs[0].get("memory_method"),
        })
    for key, values in (("predicted_rank", [r["predicted_s"] for r in rows]),
                        ("measured_rank", [r["measured_s"] for r in rows])):
        for r, rank in zip(rows, ranks(values)):
            r[key] = rank
    return rows


def passes_before_rounds(passes: int, rounds: int) -> list[int]:
    """Profile passes to measure before each round of runs: as even as possible, at least one before the first
    (the plan search needs a profile), e.g. 3 passes, 3 rounds -> [1, 1, 1]; 2, 3 -> [1, 1, 0]; 5, 2 -> [3, 2]."""
    if passes < 1 or rounds < 1:
        raise UniapError(f"--passes and --rounds must be >= 1 (got {passes}, {rounds})")
    return [passes // rounds + (1 if r < passes % rounds else 0) for r in range(rounds)]


def _passes_named(n: int) -> str:
    return "the first profile pass" if n == 1 else f"the first {n} profile passes"


def _profile_more(profiling, passes: int, total: int, path: Path, say, progress) -> dict:
    """`passes` more profile passes; the profile of all so far, also written to `path` (kept if a run fails)."""
    done = profiling.passes
    which = f"pass {done + 1}" if passes == 1 else f"passes {done + 1}-{done + passes}"
    say(f"profiling {profiling.config.name} on {profiling.nproc} local ranks ({which} of {total})")
    doc = profiling.measure(passes, progress)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _assignment_key(plan) -> tuple:
    return (plan.pipeline.degree, plan.pipeline.micro_batches, plan.pipeline.schedule,
            tuple((l.stage, l.strategy) for l in plan.layers))


def draw(result: dict, path: Path) -> None:
    """Predicted vs measured iteration time (and memory) per plan, as a PNG (matplotlib Agg, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result["rows"]
    fig = Figure(figsize=(12, 5), dpi=110)
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(1, 2)
    pred = np.array([r["predicted_s"] for r in rows]) * 1e3
    meas = np.array([r["measured_s"] for r in rows]) * 1e3
    hi = max(pred.max(), meas.max()) * 1.1
    ax.plot([0, hi], [0, hi], color="#888888", lw=1, ls="--", label="predicted = measured")
    ax.fill_between([0, hi], [0, hi * 0.9], [0, hi * 1.1], color="#DDDDDD", alpha=0.5, label="±10%")
    for r, p, m in zip(rows, pred, meas):
        ax.scatter([m], [p], color="#C44E52" if r["chosen"] else "#4C72B0", s=40 if r["chosen"] else 25, zorder=3)
        ax.annotate(r["plan"], (m, p), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("measured iteration time (ms)")
    ax.set_ylabel("predicted iteration time (ms)")
    tau, err, regret = result["kendall_tau"], result["median_abs_rel_error"], result["regret"]
    ax.set_title(f"time: median |error| {err * 100:.1f}%, Kendall τ {tau:.2f}, regret "
                 f"{(regret or 0) * 100:.1f}%", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    pm = np.array([r["predicted_memory_bytes"] for r in rows]) / 1e6
    mm = np.array([r["measured_memory_bytes"] for r in rows]) / 1e6
    x = np.arange(len(rows))
    bx.bar(x - 0.2, pm, 0.4, label="predicted", color="#4C72B0")
    bx.bar(x + 0.2, mm, 0.4, label="measured", color="#DD8452")
    bx.set_xticks(x)
    bx.set_xticklabels([r["plan"] for r in rows], rotation=60, ha="right", fontsize=7)
    bx.set_ylabel("peak memory per rank (MB)")
    merr = result.get("memory_median_abs_rel_error")
    bx.set_title("memory" + (f": median |error| {merr * 100:.1f}%" if merr is not None else ""), fontsize=9)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(str(path))
