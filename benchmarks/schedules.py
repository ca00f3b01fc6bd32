"""Each pipeline schedule's best plan on large targets: what zero bubble buys over 1F1B and interleaved 1F1B.

For each target the planner searches each schedule on its own (`plan --schedule 1f1b`, `zero-bubble`,
`zero-bubble-v`, `dualpipe-v`), 1F1B with interleaving (`interleaved-1f1b`) and the default search (all of
them together), and prints the plan each search returns: its layout, its predicted
time per iteration and what the search took. Zero bubble is searched like the
others: its time is the closed form that bounds torch's ScheduleInterleavedZeroBubble order from above
(docs/cost-model.md, "Zero bubble"), over ZeRO-0 strategies with the gradient all-reduce after the step (what
`uniap run` trains). The last column re-prices the interleaved search's layout under zero bubble, where it runs
(ZeRO-0 only), to tell the schedule's gain from the strategies it gives up.

Run:  python benchmarks/schedules.py [--time-limit S] [--only LABEL]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from uniap.api import with_engine
from uniap.errors import UniapError
from uniap.estimate import cost_plan
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
SEARCHES = ("1f1b", "interleaved-1f1b", "zero-bubble", "zero-bubble-v", "dualpipe-v", "default")


def layout(plan) -> str:
    pipe = plan.pipeline
    chunks = f"·v{pipe.virtual_stages}" if pipe.virtual_stages > 1 else ""
    zb = {"zero-bubble": " zb", "zero-bubble-v": " zbv", "dualpipe-v": " dpv"}.get(pipe.schedule, "")
    return f"pp{pipe.degree}{chunks} c{pipe.micro_batches}{zb}"


def as_zero_bubble(plan, model, cluster) -> str:
    """The plan's stages, chunks and strategies priced under zero bubble, or why that cannot run."""
    try:
        other = dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, schedule="zero-bubble"))
        other.validate()
        program, stage_of, strategy_of = cost_plan(other, model, cluster)
    except UniapError as exc:
        return f"— ({str(exc)[:30]})"
    t = evaluate(program, stage_of, strategy_of)
    return f"{t:.2f} s" if t < float("inf") else "does not run"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=None)
    parser.add_argument("--only", default=None, help="a target label's first word (GPT-3, Llama-2, Llama-3)")
    args = parser.parse_args()
    print(f"{'target':<34} {'search':<18} {'plan':<20} {'time/iter':>10} {'search':>9} {'optimal':>8} "
          f"{'its layout as zero bubble':>26}")
    for label, name, cluster_name, batch, seq, kernels in TARGETS:
        if args.only and not label.startswith(args.only):
            continue
        cluster = with_engine(load_cluster(cluster_name), kernels)
        model = load_model(name, seq)
        for search in SEARCHES:
            started = time.perf_counter()
            plan = plan_search(model, cluster, Workload(batch, seq, "bf16"), schedule=search,
                               time_limit=args.time_limit)
            took = time.perf_counter() - started
            again = as_zero_bubble(plan, model, cluster) if search == "interleaved-1f1b" else ""
            print(f"{label:<34} {search:<18} {layout(plan):<20} {plan.predicted['iteration_time_s']:>8.2f} s "
                  f"{took:>7.1f} s {str(bool(plan.search['optimal'])):>8} {again:>26}", flush=True)


if __name__ == "__main__":
    main()
