"""Accuracy of the calibrated cost model on this machine: `uniap demo` end to end, several times.

Each repetition profiles the demo GPT on 4 local ranks, plans it with the calibrated model, runs the chosen plan
and 12 hand-written ones (three interleaved rounds), and compares predicted with measured. Targets (issue):

    median |relative error| of iteration time <= 10%   Kendall τ (predicted vs measured order) >= 0.8
    regret of the chosen plan <= 10%                    memory, predicted vs measured, within 15%

Timings on a shared 2-core machine vary run to run, so the script repeats the demo, reports each repetition,
the spread of every plan's measured time across repetitions (the noise floor any prediction lives with), and the
CPU time other processes took while it ran (another user's job — e.g. a benchmark of the solver — slows the runs
or the profile, not both alike, and makes that repetition's errors meaningless; it is flagged above 5% of a core).

Run:  python benchmarks/demo_accuracy.py [--repeat 3] [--out-dir out/demo-accuracy] [--json results.json]
      [--reuse-profile]   (profile once, then only plan + run in the later repetitions)
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

TARGETS = {"median_abs_rel_error": 0.10, "kendall_tau": 0.80, "regret": 0.10, "memory_max_abs_rel_error": 0.15}


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
        ok = value is not None and (value >= limit if key == "kendall_tau" else value <= limit)
        out[key] = {"value": value, "target": limit, "met": bool(ok)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out-dir", default="out/demo-accuracy")
    parser.add_argument("--json", default=None, help="write all repetitions' results here")
    parser.add_argument("--reuse-profile", action="store_true", help="profile once, reuse it in later repetitions")
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args(argv)

    from rich.console import Console

    from uniap.commands.demo import demo_table, summary_lines
    from uniap.demo import run_demo

    console = Console(width=200)
    runs = []
    profile = None
    for i in range(args.repeat):
        out = Path(args.out_dir) / f"run-{i + 1}"
        before, started = others_cpu_seconds(), time.perf_counter()
        result = run_demo(out, nproc=args.nproc, profile_path=profile,
                          say=lambda text, i=i: console.print(f"[dim]run {i + 1}: {text}[/dim]"))
        wall = time.perf_counter() - started
        others = others_cpu_seconds() - before
        if args.reuse_profile:
            profile = result["profile"]
        result["others_cpu_s"] = others
        result["wall_s"] = wall
        result["verdict"] = verdict(result)
        runs.append(result)
        console.print(demo_table(result))
        for line in summary_lines(result):
            console.print(line)
        busy = others / wall
        flag = " [red](other processes were busy: this repetition measures them too)[/red]" if busy > 0.05 else ""
        console.print(f"other processes used {others:.1f} CPU-s during the {wall:.0f} s of this repetition "
                      f"({busy * 100:.0f}% of one core){flag}")
        met = ", ".join(f"{k} {'met' if v['met'] else 'MISSED'}" for k, v in result["verdict"].items())
        console.print(f"targets: {met}\n")

    console.rule("summary over repetitions")
    for key, limit in TARGETS.items():
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            console.print(f"{key}: " + ", ".join(f"{v:.3f}" for v in values) + f"   (median {statistics.median(values):.3f},"
                          f" target {'>=' if key == 'kendall_tau' else '<='} {limit})")
    if len(runs) > 1:
        console.print("noise: spread (max/min − 1) of each plan's measured time across repetitions")
        names = [row["plan"] for row in runs[0]["rows"]]
        spreads = []
        for name in names:
            times = [next(r["measured_s"] for r in run["rows"] if r["plan"] == name) for run in runs
                     if any(r["plan"] == name for r in run["rows"])]
            spread = max(times) / min(times) - 1
            spreads.append(spread)
            console.print(f"  {name:16s} " + "  ".join(f"{t * 1e3:7.1f} ms" for t in times) + f"   spread {spread * 100:5.1f}%")
        console.print(f"median spread {statistics.median(spreads) * 100:.1f}%")
    console.print("demo wall time per repetition: " + ", ".join(f"{r['wall_s']:.0f} s" for r in runs))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    ok = all(all(v["met"] for v in r["verdict"].values()) for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
