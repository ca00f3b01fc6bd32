"""Accuracy of the calibrated cost model on this machine: `uniap demo` end to end, for two models, several times.

Each repetition runs the demo for each model — the demo GPT and a llama-family config with grouped-query attention
(`GQA_LLAMA`, the one of tests/demo/test_demo.py) — : profile on 4 local ranks (3 passes, spread between the
rounds), plan with the calibrated model, run the chosen plan and the hand-written ones (three interleaved rounds),
compare predicted with measured, and give every prediction its 90% interval from the profile's passes
(`uniap.profile.uncertainty`). Per model and repetition it prints the median error, Kendall τ, the chosen plan's
regret and the share of measured times inside their interval. Targets (issue 24):

    median |relative error| of iteration time <= 10%   Kendall τ (predicted vs measured order) >= 0.8
    regret of the chosen plan <= 5%                     memory, predicted vs measured, within 15%
    measured inside its predicted interval >= 80%

Timings on a shared 2-core machine vary run to run, so the script repeats the demo and reports each repetition;
the spread of every plan's measured time across repetitions and across the rounds of one repetition
(`uniap.demo.round_spread`: the noise floor any prediction lives with); and the CPU time other processes took
while it ran (another user's job — e.g. a benchmark of the solver — slows the runs or the profile, not both alike,
and makes that repetition's errors meaningless; it is flagged above 5% of a core). A neighbour on the host is
invisible to that count; the rounds' spread shows it.

Run:  python benchmarks/demo_accuracy.py [--repeat 3] [--models demo-gpt,gqa-llama] [--out-dir out/demo-accuracy]
      [--json results.json] [--comparisons N] [--score-only]   (score-only: measure nothing, re-score --out-dir)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

TARGETS = {"median_abs_rel_error": 0.10, "kendall_tau": 0.80, "regret": 0.05, "memory_max_abs_rel_error": 0.15,
           "inside_interval": 0.80}
AT_LEAST = ("kendall_tau", "inside_interval")


def others_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy, minus this process's and its (waited-for) children's own:
    a running total of what other users' processes took (Linux /proc/stat; 0 elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy - (own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime)


def verdict(result: dict) -> dict:
    out = {}
    for key, limit in TARGETS.items():
        value = result.get(key)
        ok = value is not None and (value >= limit if key in AT_LEAST else value <= limit)
        out[key] = {"value": value, "target": limit, "met": bool(ok)}
    return out


GQA_LLAMA = {"_name_or_path": "gqa-llama", "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2,
             "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 64}
"""The llama-family config with grouped-query attention (2 kv heads for 4 query heads) of tests/demo/test_demo.py,
run here at the demo's workload (64 tokens, global batch 16) so that every hand plan (pp4 with 8 micro-batches
included) is expressible."""


def models(out_dir: Path, which: list[str]) -> list[tuple[str, object]]:
    from uniap.demo import DEMO_MODEL
    from uniap.spec import load_model

    out = []
    for name in which:
        if name == "demo-gpt":
            out.append((name, DEMO_MODEL))
        elif name == "gqa-llama":
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / "gqa-llama.config.json"
            path.write_text(json.dumps(GQA_LLAMA, indent=1) + "\n")
            out.append((name, load_model(str(path)).config))
        else:
            raise SystemExit(f"unknown model {name!r} (demo-gpt, gqa-llama)")
    return out


def score(result: dict, run_dir: Path, repredict: bool) -> dict:
    """Intervals of every plan from the run's own profile (`uniap.intervals`) and the share of measured
    times inside them; added to `result` (`repredict`: the rows costed again with the checked-out model first)."""
    from uniap.demo import score_intervals

    return score_intervals(result, run_dir, repredict=repredict)


def model_error_rows(runs: dict[str, list[dict]]) -> list[dict]:
    """Every scored plan of every run, as `uniap/profile/model_error.json` keeps them."""
    return [{"model": name, "run": f"run-{i + 1}", "plan": row["plan"], "relayout": row["relayout"],
             "predicted_s": round(row["predicted_s"], 7), "measured_s": round(row["measured_s"], 7),
             "replicate_s": [round(x, 7) for x in row["interval_replicate_s"]]}
            for name, results in runs.items() for i, result in enumerate(results)
            for row in result["rows"] if "interval_replicate_s" in row]


def write_model_error(path: Path, runs: dict[str, list[dict]], kind: str, device: str, measured: str) -> dict:
    """Write (or update) the model-error entry of `kind` in `path` from these runs; returns σ_m per class of plan
    (one layout, relayout)."""
    from uniap.profile.uncertainty import fit_classes

    rows = model_error_rows(runs)
    doc = json.loads(path.read_text()) if path.exists() else {"kinds": {}}
    doc["kinds"][kind] = {"device": device, "measured": measured, "rows": rows}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return fit_classes(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out-dir", default="out/demo-accuracy")
    parser.add_argument("--json", default=None, help="write all repetitions' results here")
    parser.add_argument("--models", default="demo-gpt,gqa-llama", help="comma-separated: demo-gpt, gqa-llama")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--comparisons", type=int, default=None, help="hand plans per run (default: all)")
    parser.add_argument("--score-only", action="store_true",
                        help="measure nothing: score the runs already in --out-dir (their demo.json and profile), "
                             "every plan costed again with the checked-out cost model")
    parser.add_argument("--fit-model-error", metavar="FILE", default=None,
                        help="write the scored plans to FILE as the model-error runs of their kind of device "
                             "(uniap/profile/model_error.json's format; --measured says when and where)")
    parser.add_argument("--measured", default="", help="with --fit-model-error: when, where and at which commit")
    args = parser.parse_args(argv)

    from rich.console import Console

    from uniap.commands.demo import demo_table, summary_lines
    from uniap.demo import DEMO_BATCH, DEMO_SEQ, run_demo

    console = Console(width=200)
    runs = {name: [] for name in args.models.split(",")}
    for i in range(args.repeat):
        for name, config in models(Path(args.out_dir), list(runs)):
            out = Path(args.out_dir) / f"run-{i + 1}" / name
            if args.score_only:
                if not (out / "demo.json").exists():
                    raise SystemExit(f"--score-only: no run in {out} (it scores runs 1..--repeat of each model)")
                result = json.loads((out / "demo.json").read_text())
            else:
                before, started = others_cpu_seconds(), time.perf_counter()
                result = run_demo(out, nproc=args.nproc, config=config, seq_len=DEMO_SEQ, global_batch=DEMO_BATCH,
                                  comparisons=args.comparisons,
                                  say=lambda text, i=i, n=name: console.print(f"[dim]run {i + 1} {n}: {text}[/dim]"))
                result["wall_s"] = time.perf_counter() - started
                result["others_cpu_s"] = others_cpu_seconds() - before
                (out / "demo.json").write_text(json.dumps(result, indent=1) + "\n")
            try:
                score(result, out, repredict=args.score_only)
            except ImportError:  # scored later with --score-only
                pass
            result["verdict"] = verdict(result)
            runs[name].append(result)
            console.print(demo_table(result))
            for line in summary_lines(result):
                console.print(line)
            busy = result["others_cpu_s"] / result["wall_s"]
            flag = " [red](other processes were busy: this repetition measures them too)[/red]" if busy > 0.05 else ""
            console.print(f"run {i + 1} {name}: other processes used {result['others_cpu_s']:.1f} CPU-s during the "
                          f"{result['wall_s']:.0f} s of this repetition ({busy * 100:.0f}% of one core){flag}")
            met = ", ".join(f"{k} {'met' if v['met'] else 'MISSED'}" for k, v in result["verdict"].items())
            console.print(f"targets: {met}\n")
    for name, model_runs in runs.items():
        summarize(console, name, model_runs)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    if args.fit_model_error:
        first = next(r for rs in runs.values() for r in rs)
        kind = json.loads(Path(first["profile"]).read_text())["device"]
        device = (f"{first['cluster']}: {kind.get('backend')} ranks on {kind.get('cores')} cores of {kind.get('name')}, "
                  f"models {', '.join(runs)}")
        sigma = write_model_error(Path(args.fit_model_error), runs, kind["kind"], device, args.measured)
        console.print(f"model error of {kind['kind']} profiles fitted on {len(model_error_rows(runs))} plans: "
                      + ", ".join(f"{what} {v * 100:.1f}%" for what, v in sigma.items())
                      + f" (written to {args.fit_model_error})")
    ok = all(all(v["met"] for v in r["verdict"].values()) for rs in runs.values() for r in rs)
    return 0 if ok else 1


def summarize(console, name: str, runs: list[dict]) -> None:
    console.rule(f"{name}: summary over repetitions")
    for key, limit in TARGETS.items():
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            console.print(f"{key}: " + ", ".join(f"{v:.3f}" for v in values) + f"   (median {statistics.median(values):.3f},"
                          f" target {'>=' if key in AT_LEAST else '<='} {limit})")
    from uniap.profile.uncertainty import CLASSES

    for what in CLASSES.values():
        here = [r["model_error_here"][what] for r in runs if isinstance(r.get("model_error_here"), dict)
                and r["model_error_here"].get(what) is not None]
        if here:
            used = runs[0]["model_error_used"].get(what)
            console.print(f"model error each run alone would fit, {what}: " + ", ".join(f"{v * 100:.1f}%" for v in here)
                          + (f"   (the intervals hold {used * 100:.1f}%, fitted on earlier runs: "
                             "uniap/profile/model_error.json)" if used is not None else "   (the intervals hold none)"))
    if len(runs) > 1:
        console.print("noise: spread (max/min − 1) of each plan's measured time across repetitions")
        spreads = []
        for row in runs[0]["rows"]:
            times = [r["measured_s"] for run in runs for r in run["rows"] if r["plan"] == row["plan"]]
            spread = max(times) / min(times) - 1
            spreads.append(spread)
            console.print(f"  {row['plan']:16s} " + "  ".join(f"{t * 1e3:7.1f} ms" for t in times)
                          + f"   spread {spread * 100:5.1f}%")
        console.print(f"median spread {statistics.median(spreads) * 100:.1f}%")
    within = [r.get("round_spread") for r in runs]
    if all(x is not None for x in within):
        console.print("noise within each repetition (a plan's rounds, max/min − 1, median over the plans): "
                      + ", ".join(f"{x * 100:.1f}%" for x in within))
    console.print("wall time per repetition: " + ", ".join(f"{r['wall_s']:.0f} s" for r in runs)
                  + "; other processes' CPU-s: " + ", ".join(f"{r['others_cpu_s']:.1f}" for r in runs))


if __name__ == "__main__":
    sys.exit(main())
