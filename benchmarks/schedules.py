"""Each pipeline schedule's predicted time on large targets: what zero bubble buys over 1F1B and interleaved 1F1B.

For each target the planner's two searches run (1F1B alone, and 1F1B with interleaving: the default), and each
returned layout (stages, chunks, strategies) is priced again under every schedule that can run it: GPipe and 1F1B
for plain layouts, zero bubble (torch's ScheduleInterleavedZeroBubble, ZB-H1 with one chunk per stage) for both.
Zero bubble is priced, not searched: its time is its own event simulation with every chunk at the plan's largest
forward, input pass and weight pass (docs/cost-model.md, "Zero bubble"), which the MILP does not encode, so these
are the other schedules' optimal layouts re-priced, a lower bound on what a zero-bubble search would gain.
A layout that does not fit in memory under a schedule is marked (zero bubble keeps activations until the weight pass).

Run:  python benchmarks/schedules.py [--time-limit S]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from uniap.api import with_engine
from uniap.errors import UniapError
from uniap.estimate import cost_plan, evaluate_unchecked
from uniap.planner import plan_search
from uniap.solve.program import evaluate
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload

TARGETS = [  # label, model, cluster, global batch, sequence length, --kernels
    ("GPT-3 175B, 64 A100, B64", "gpt3-175b", "a100-80g:8x8", 64, 2048, "fused"),
    ("Llama-2-70B, 64 A100, B512", "llama2-70b", "a100-80g:8x8", 512, 4096, None),
    ("Llama-3-405B, 16,384 H100, B2048", "llama3-405b", "h100-80g:2048x8", 2048, 8192, "fused"),
]


def repriced(plan, model, cluster, schedule: str) -> str:
    """The plan's layout under `schedule`: seconds, or why it cannot run."""
    pipe = dataclasses.replace(plan.pipeline, schedule=schedule)
    try:
        other = dataclasses.replace(plan, pipeline=pipe)
        other.validate()
        program, stage_of, strategy_of = cost_plan(other, model, cluster)
    except UniapError as exc:
        return f"— ({str(exc)[:40]})"
    t = evaluate_unchecked(program, stage_of, strategy_of)
    fits = evaluate(program, stage_of, strategy_of) < float("inf")
    return f"{t:.2f} s" + ("" if fits else " (OOM)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=None)
    args = parser.parse_args()
    print(f"{'target':<34} {'searched as':<22} {'layout':<18} {'gpipe':>12} {'1f1b':>12} {'interleaved':>12} "
          f"{'zero bubble':>14}")
    for label, name, cluster_name, batch, seq, kernels in TARGETS:
        cluster = with_engine(load_cluster(cluster_name), kernels)
        model = load_model(name, seq)
        for searched in ("1f1b", "interleaved-1f1b"):
            started = time.perf_counter()
            plan = plan_search(model, cluster, Workload(batch, seq, "bf16"), schedule=searched,
                               time_limit=args.time_limit)
            pipe = plan.pipeline
            layout = f"pp{pipe.degree}" + (f"·v{pipe.virtual_stages}" if pipe.virtual_stages > 1 else "") \
                + f" c{pipe.micro_batches}"
            cells = {s: repriced(plan, model, cluster, s) for s in ("gpipe", "1f1b", "interleaved-1f1b",
                                                                   "zero-bubble")}
            if pipe.virtual_stages > 1:
                cells["gpipe"] = cells["1f1b"] = "—"
            else:
                cells["interleaved-1f1b"] = "—"
            print(f"{label:<34} {searched + f' ({time.perf_counter() - started:.0f} s)':<22} {layout:<18} "
                  f"{cells['gpipe']:>12} {cells['1f1b']:>12} {cells['interleaved-1f1b']:>12} "
                  f"{cells['zero-bubble']:>14}", flush=True)


if __name__ == "__main__":
    main()
