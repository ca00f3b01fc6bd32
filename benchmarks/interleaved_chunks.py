"""Interleaved 1F1B on uneven chunks: measured step time and peak memory against the cost model's predictions.

    python benchmarks/interleaved_chunks.py [--pairs 3] [--steps 12] [--quick] [--profile PROFILE.json]
                                            [--schedules]

An 8-block GPT (the demo's GPT-2 architecture: hidden 256, 4 heads, FFN 1024, vocabulary 1024; seq 64, batch 8)
runs as pp2 · v2 with c = 4 on as many gloo ranks as this machine has cores (`os.cpu_count()`, one OpenMP thread
each), so that a rank waiting in a bubble leaves its core idle and a bubble costs real time. (With more ranks than
cores a waiting rank gives its core to a busy one and the difference drowns.) Two plans, the stage sums equal:

  balanced  embedding + 2 blocks | 2 blocks | 2 blocks | 2 blocks + head
  uneven    embedding + 3 blocks | 1 block  | 1 block  | 3 blocks + head

(chunk j on stage j mod 2: stage 0 runs chunks 0 and 2, stage 1 chunks 1 and 3; every stage holds 4 blocks and one
of the embedding / head either way). With 2 ranks each stage has one rank; with 4, dp2 per stage, and so on (the
batch grows to 4·dp when a micro-batch of 2 cannot be split over dp).

`--schedules` compares schedules instead of chunks: the balanced chunks under interleaved 1F1B against the same
chunks under zero bubble (torch's ScheduleInterleavedZeroBubble: the backward split into input and weight passes,
the weight passes deferred into the bubble), measured, formula and simulation alike (zero bubble's formula is its
simulation).

Runs alternate in pairs (balanced, uneven, balanced, uneven, ...), one torchrun launch each (`runtime.run_many`),
so a slow spell of the shared machine touches both sides; a run's time is the median of its step times after
the first WARMUP_STEPS (a step's time is the slowest rank's). Per pair the table gives both medians and their
ratio uneven / balanced, next to
  (a) the formula's ratio: the plans' predicted iteration times (`report.render.recost(...).tpi`, which is
      `solve.program.evaluate`, what `uniap plan` optimises and `uniap estimate --plan` prints), and
  (b) the simulation's ratio: the report's event simulation of torch's operation order (`report.render.
      timeline_boxes` + `report.timeline.makespan`) on the same per-chunk costs.
A second measured ratio ("÷compute") divides each run's step time by its stages' mean measured compute per step
(`stage_time_s`: forward, loss and backward, pipeline waits excluded) first, so that a slowdown of the whole
machine between two runs cancels and what is compared is the step over its work, as the simulation's ratio is (the
stage sums are equal). The 1-minute load average after each pair is printed too: a load above the core count means
other processes take the cores a waiting rank leaves, and the ratios are then mostly noise.
Both predictions come from the project's functions at run time, so the script prints whatever the current formulas compute.
The cost model is the CPU preset the demo uses (`cpu:1xN`), or a calibrated profile with `--profile`; only the
ratios are meant to compare (the preset's absolute times are not this machine's).

Memory: per stage, the measured peak (the runtime's CPU account: parameters + gradients + optimizer states +
the peak of autograd's saved activations, metered on the first step) against the predicted peak that recost
shows (`estimate.cost_plan` + `solve.program.stage_times`, framework reserve left out, as the runtime's account
has none), and the activation part alone. The runs use AdamW in fp32, whose states (weight, gradient, two moments:
16 B per parameter) are what the cost model charges, so the measured activations are the measured peak less the
predicted model states (with dp1 per stage nothing is sharded and these are the same bytes on both sides). The
"walked" column takes the predicted per-micro-batch activation bytes of each chunk through the stage's operation
order (`Schedule.order`, uniap/schedules.py), adding a chunk's bytes at each of its forwards and releasing them at
its backward: what the schedule holds at its peak for the chunks the plan has, next to what the in-flight
formula charges. The per-layer bytes have their own error; the ratios uneven / balanced cancel it.

`--quick`: one pair (a smoke run). On 2 quiet cores a launch starts in ~7 s and a step takes ~0.2 s: the full run
(3 pairs of 12-step runs) takes about a minute; on a busy machine 3-5 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

BLOCKS = 8
MICRO_BATCHES = 4
STAGES, VIRTUAL = 2, 2
SEQ_LEN = 64
BATCH = 8
SPLITS = {  # layers per chunk, chunk j on stage j mod STAGES (chain: embedding, 8 blocks, head)
    "balanced": [3, 2, 2, 3],
    "uneven": [4, 1, 1, 4],
}
MB = 1e6


def model_config():
    from uniap.demo import DEMO_MODEL

    return replace(DEMO_MODEL, name="chunks-gpt", layers=BLOCKS, max_seq=SEQ_LEN)


def build_plans(world: int, schedules: bool = False) -> dict:
    """name -> Plan: pp2 · v2, c = 4, dp = world / 2 per stage; each chunk as SPLITS says under interleaved 1F1B,
    or (`schedules`) the balanced chunks under interleaved 1F1B and under zero bubble."""
    from uniap.runtime.plans import uniform_plan

    dp = world // STAGES
    batch = max(BATCH, MICRO_BATCHES * dp)
    batch += -batch % (MICRO_BATCHES * dp)  # every micro-batch splits evenly over dp
    cases = {"interleaved": ("interleaved-1f1b", SPLITS["balanced"]), "zero-bubble": ("zero-bubble",
                                                                                      SPLITS["balanced"])} \
        if schedules else {name: ("interleaved-1f1b", split) for name, split in SPLITS.items()}
    return {name: uniform_plan(model_config(), world, pp=STAGES, dp=dp, micro_batches=MICRO_BATCHES,
                               schedule=schedule, virtual_stages=VIRTUAL, global_batch=batch,
                               seq_len=SEQ_LEN, stage_layers=split)
            for name, (schedule, split) in cases.items()}


def chunk_label(plan, j: int) -> str:
    """'embed + 3 blocks', '1 block', '3 blocks + head' for chunk j."""
    names = [layer.name for layer in plan.layers if layer.position == j]
    blocks = [k for k, n in enumerate(names) if n.startswith("block")]
    count = f"{len(blocks)} block{'s' if len(blocks) != 1 else ''}"
    return " + ".join(names[:blocks[0]] + [count] + names[blocks[-1] + 1:]) if blocks else " + ".join(names)


def cost_cluster(world: int, profile: str | None):
    """The CPU preset the demo costs with (`cpu:1xN`), calibrated with `profile` when one is given."""
    from uniap.spec.cluster import load_cluster

    cluster = load_cluster(f"cpu:1x{world}")
    if profile is None:
        return cluster
    from uniap.estimate import workload_of
    from uniap.profile.calibration import calibrate
    from uniap.profile.schema import load_profile
    from uniap.spec.families import build_layers

    plan = next(iter(build_plans(world).values()))
    model = build_layers(plan.model_config(), SEQ_LEN)
    return calibrate(cluster, load_profile(profile), model=model, workload=workload_of(plan))


def walked_activations(plan, per_micro: list[float]) -> list[float]:
    """Per stage: the peak of the chunks' activation bytes held through the stage's operation order (a chunk's
    per-micro-batch bytes added at each of its forwards, released at its backward, or its weight pass)."""
    from uniap.schedules import held_until, schedule_named

    P, c, v = len(plan.stages), int(plan.pipeline.micro_batches), plan.virtual_stages
    schedule = schedule_named(str(plan.pipeline.schedule))
    out = []
    for stage in range(P):
        current = peak = 0.0
        for kind, j, _m in schedule.order(stage, P, c, v):
            if kind not in ("F", held_until(schedule)):
                continue
            current += per_micro[j] if kind == "F" else -per_micro[j]
            peak = max(peak, current)
        out.append(peak)
    return out


def predictions(plans: dict, cluster) -> dict:
    """name -> formula TPI, simulated makespan, per-chunk times and per-stage memory, all from the project.

    Time: `report.render.recost` (its `tpi` is `solve.program.evaluate`, its per-chunk times feed the report's
    timeline). Memory: what recost re-costs it from, `estimate.cost_plan` + `solve.program.stage_times` (per
    device group; model states and activations split as recost splits them)."""

    from uniap.errors import UniapError
    from uniap.estimate import cost_plan
    from uniap.report.render import recost, timeline_boxes
    from uniap.report.timeline import makespan
    from uniap.solve.program import stage_times
    from uniap.spec.families import build_layers

    out = {}
    for name, plan in plans.items():
        fig = recost(plan, cluster)
        if getattr(fig, "note", ""):
            raise UniapError(f"{name}: {fig.note}")
        program, stage_of, strategy_of = cost_plan(plan, build_layers(plan.model_config(), SEQ_LEN), cluster)
        times = stage_times(program, stage_of, strategy_of)
        memory, states = times.memory, fig.states  # the report's split: model states, and activations at the peak
        held = times.held[stage_of]  # per layer: what its chunk holds at its stage's peak
        per_micro = [0.0] * program.stages
        for u, (j, k) in enumerate(zip(stage_of, strategy_of)):
            per_micro[int(j)] += float(program.Ma[u, k])
        out[name] = {
            "formula_s": float(fig.tpi),
            "simulated_s": float(makespan(timeline_boxes(plan, fig))),
            "chunk_s": [float(x) for x in fig.chunk_p],
            "stage_s": [float(x) for x in fig.p],
            "peak_bytes": [float(m) for m in memory],
            "states_bytes": [float(m) for m in states],
            "activation_bytes": [float(m - st) for m, st in zip(memory, states)],
            "held": [float(h) for h in held],
            "chunk_activation_bytes_per_micro_batch": per_micro,
            "walked_activation_bytes": walked_activations(plan, per_micro),
        }
    return out


def step_time(result: dict) -> float:
    """A run's time: the median of its step times after the first WARMUP_STEPS (each the slowest rank's)."""
    from uniap.demo import WARMUP_STEPS

    return statistics.median(result["step_times_s"][WARMUP_STEPS:])


def work(result: dict) -> float:
    """A run's mean over its stages of the measured compute per step (forward, loss and backward of the stage's
    micro-batches, pipeline waits excluded): the step's time without its bubble."""
    return statistics.fmean(result["stage_time_s"])


def per_stage(plan, per_rank: list[float]) -> list[float]:
    """The worst rank of each stage."""
    return [max(float(per_rank[r]) for r in stage.ranks) for stage in plan.stages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="alternated (balanced, uneven) pairs of runs")
    parser.add_argument("--steps", type=int, default=12, help="steps per run (the first 2 are not timed)")
    parser.add_argument("--quick", action="store_true", help="one pair: a smoke run")
    parser.add_argument("--nproc", type=int, default=None, help="gloo ranks (default: os.cpu_count())")
    parser.add_argument("--profile", default=None, help="cost with this calibrated profile instead of the preset")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--schedules", action="store_true",
                        help="interleaved 1F1B against zero bubble on the balanced chunks, instead of chunk splits")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a collective may wait")
    args = parser.parse_args(argv)

    os.environ["OMP_NUM_THREADS"] = "1"  # one thread per rank: the launcher passes it on to the ranks
    from uniap.demo import WARMUP_STEPS
    from uniap.runtime.job import TrainingJob
    from uniap.runtime.launch import run_many

    pairs = 1 if args.quick else args.pairs
    world = args.nproc or os.cpu_count() or 2
    world -= world % STAGES
    if pairs < 1 or args.steps <= WARMUP_STEPS or world < STAGES:
        parser.error(f"--pairs must be >= 1, --steps > {WARMUP_STEPS}, and at least {STAGES} ranks")
    plans = build_plans(world, args.schedules)
    cluster = cost_cluster(world, args.profile)
    pred = predictions(plans, cluster)
    names = list(plans)
    base, other = names

    first = plans[base]
    dp = world // STAGES
    print(f"interleaved chunks: {BLOCKS}-block GPT (hidden {first.model_config().hidden}, seq {SEQ_LEN}), "
          f"batch {first.workload.global_batch}, pp{STAGES} · v{VIRTUAL}" + (f" · dp{dp}" if dp > 1 else "")
          + f", c = {MICRO_BATCHES}, {world} gloo ranks on {os.cpu_count()} cores, OMP_NUM_THREADS=1")
    print(f"cost model: {cluster.name}" + (f" calibrated with {args.profile}" if args.profile else " (preset)")
          + "; the predicted times are the model's, only their ratios compare with the measured one")
    print()
    print(f"{'plan':<10} {'chunks (chunk j on stage j mod 2)':<62} {'chunk times, model (ms)':<28}"
          f"{'formula':>9} {'simulated':>10}")
    for name, plan in plans.items():
        labels = " | ".join(chunk_label(plan, j) for j in range(STAGES * VIRTUAL))
        chunk_ms = " ".join(f"{t * 1e3:.1f}" for t in pred[name]["chunk_s"])
        print(f"{name:<10} {labels:<62} {chunk_ms:<28}{pred[name]['formula_s']:>8.3f}s"
              f"{pred[name]['simulated_s']:>9.3f}s")
    formula_ratio = pred[other]["formula_s"] / pred[base]["formula_s"]
    sim_ratio = pred[other]["simulated_s"] / pred[base]["simulated_s"]
    for name in names:
        stage_ms = ", ".join(f"{t * 1e3:.1f}" for t in pred[name]["stage_s"])
        print(f"  {name}: stage times per micro-batch (model): {stage_ms} ms; formula / simulated "
              f"{pred[name]['formula_s'] / pred[name]['simulated_s']:.3f}")
    print()

    paths, loads = {}, []
    results: dict[str, list[dict]] = {name: [] for name in names}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="interleaved-chunks-") as tmp:
        for name, plan in plans.items():
            paths[name] = str(Path(tmp) / f"{name}.json")
            plan.save(paths[name])
        print(f"{'pair':<5} {base + ' (s)':>14} {other + ' (s)':>12} {'measured':>9} {'÷compute':>9} {'formula':>8} "
              f"{'simulated':>10} {'load':>6}")
        for k in range(pairs):
            for name in names:  # one launch per run, alternated
                job = TrainingJob(paths[name], steps=args.steps, optimizer="adamw")
                results[name].append(run_many([job], nproc=world, timeout_s=args.timeout)[0])
            loads.append(os.getloadavg()[0])
            med = {n: step_time(results[n][k]) for n in names}
            per_work = {n: med[n] / work(results[n][k]) for n in names}
            print(f"{k + 1:<5} {med[base]:>14.3f} {med[other]:>12.3f} {med[other] / med[base]:>9.3f} "
                  f"{per_work[other] / per_work[base]:>9.3f} {formula_ratio:>8.3f} {sim_ratio:>10.3f} "
                  f"{loads[-1]:>6.1f}", flush=True)
    wall = time.perf_counter() - started

    def timed(name: str, k: int) -> list[float]:
        return results[name][k]["step_times_s"][WARMUP_STEPS:]

    ratios = [step_time(results[other][k]) / step_time(results[base][k]) for k in range(pairs)]
    normalised = [(step_time(results[other][k]) / work(results[other][k]))
                  / (step_time(results[base][k]) / work(results[base][k])) for k in range(pairs)]
    fastest = min(min(timed(other, k)) for k in range(pairs)) / min(min(timed(base, k)) for k in range(pairs))
    print(f"{'all':<5} {'':>14} {'':>12} {statistics.median(ratios):>9.3f} {statistics.median(normalised):>9.3f} "
          f"{formula_ratio:>8.3f} {sim_ratio:>10.3f}   (medians of the pairs' ratios)")
    print(f"  measured: ratio of the runs' median step times; ÷compute: of each run's median step time over its "
          f"stages' mean measured compute per step\n  (a slowdown of the whole machine cancels, the bubble stays); "
          f"fastest step vs fastest step: {fastest:.3f}")
    for name in names:  # equal stage sums: equal within a run; a run slowed by other processes shows here
        runs = "; ".join("/".join(f"{t * 1e3:.0f}" for t in r["stage_time_s"]) for r in results[name])
        print(f"  {name}: measured compute per step of stage 0/1, each run: {runs} ms")
    print(f"  ({pairs} pair(s) of {args.steps}-step runs, the first {WARMUP_STEPS} steps untimed; {wall:.0f} s; "
          f"load: the 1-minute load average after the pair, on {os.cpu_count()} cores)")
    if max(loads) > 1.25 * (os.cpu_count() or 1):
        print(f"  WARNING: the machine was busy (load up to {max(loads):.1f} on {os.cpu_count()} cores): other "
              "processes take the cores a waiting rank leaves, so a bubble is not idle time and the measured "
              "ratios are mostly noise; run it again on a quiet machine")
    print()

    print("peak memory per stage (MB; measured: the worst rank of the stage, first step metered; "
          "activations = peak − predicted model states)")
    print(f"{'plan':<10} {'stage':>5} {'held/chunk':>11} {'pred peak':>10} {'meas peak':>10} {'err':>7}   "
          f"{'pred act':>9} {'walked':>8} {'meas act':>9} {'err':>7}")
    memory = {}
    for name, plan in plans.items():
        measured = [max(v) for v in zip(*(per_stage(plan, r["peak_memory_bytes"]) for r in results[name]))]
        p = pred[name]
        memory[name] = measured
        for s, stage in enumerate(plan.stages):
            held = sorted({h for layer, h in zip(plan.layers, p["held"]) if layer.stage == s})
            meas_act = measured[s] - p["states_bytes"][s]
            print(f"{name:<10} {s:>5} {'/'.join(f'{h:g}' for h in held):>11} {p['peak_bytes'][s] / MB:>10.2f} "
                  f"{measured[s] / MB:>10.2f} {(p['peak_bytes'][s] - measured[s]) / measured[s]:>+7.1%}   "
                  f"{p['activation_bytes'][s] / MB:>9.2f} {p['walked_activation_bytes'][s] / MB:>8.2f} "
                  f"{meas_act / MB:>9.2f} {(p['activation_bytes'][s] - meas_act) / meas_act:>+7.1%}")
    print("  (err = (predicted − measured) / measured: negative is an under-prediction; held/chunk: micro-batches "
          "each of the stage's chunks holds at its peak, from the first chunk on)")
    for s in range(STAGES):  # the ratio cancels the per-layer bytes' own error, as the time ratio does
        act = {n: memory[n][s] - pred[n]["states_bytes"][s] for n in names}
        print(f"  stage {s} activations {other} / {base}: measured {act[other] / act[base]:.3f}, formula "
              f"{pred[other]['activation_bytes'][s] / pred[base]['activation_bytes'][s]:.3f}, walked "
              f"{pred[other]['walked_activation_bytes'][s] / pred[base]['walked_activation_bytes'][s]:.3f}")

    if args.json:
        doc = {"world": world, "cluster": cluster.name, "profile": args.profile, "pairs": pairs, "steps": args.steps,
               "predicted": pred, "formula_ratio": formula_ratio, "simulated_ratio": sim_ratio,
               "measured_ratios": ratios, "per_compute_ratios": normalised, "fastest_ratio": fastest,
               "step_times_s": {n: [r["step_times_s"] for r in results[n]] for n in names},
               "stage_compute_s": {n: [r["stage_time_s"] for r in results[n]] for n in names},
               "measured_peak_bytes": memory, "load_average": loads}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from uniap.errors import UniapError

    try:
        sys.exit(main())
    except UniapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
