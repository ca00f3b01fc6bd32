"""The same plans on transformers' GPT2LMHeadModel and on our decoder, side by side: is a plan applied to the
user's own model as fast as on ours?

The demo's model (GPT-2 architecture, 4 blocks of hidden 256, 64 tokens, batch 16) on 4 local gloo ranks: the
planner's plan for the analytic cpu cluster (tp 1: transformers has no tensor-parallel plan for GPT-2) and four of
the demo's hand plans. Every plan runs on both implementations, alternated job by job in one launch per round
(which goes first alternates by round); a plan's time is the median over rounds of each run's median step after
two warm-up steps.

    python benchmarks/hf_vs_decoder.py [--rounds 4] [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

WARMUP = 2
IMPLS = ("uniap", "transformers")


def plans(world: int = 4) -> dict:
    import uniap
    from uniap.demo import DEMO_BATCH, DEMO_MODEL, DEMO_SEQ, comparison_plans
    from uniap.spec.hf import zoo_hf_config

    hf = zoo_hf_config(DEMO_MODEL)
    chosen = uniap.plan(hf, cluster=f"cpu:1x{world}", global_batch=DEMO_BATCH, seq_len=DEMO_SEQ, max_tp=1,
                        precision="fp32")
    hand = comparison_plans(DEMO_MODEL, world, DEMO_BATCH, DEMO_SEQ)
    keep = [f"dp{world}", f"dp{world}·z3", f"pp2·dp{world // 2} c=4", "pp4 c=8"]
    out = {"uniap (analytic, tp 1)": chosen}
    for name in keep:
        plan = hand[name]
        out[name] = replace(plan, model=replace(plan.model, hf_config=hf))
    return out


def main() -> None:
    from uniap.runtime.job import TrainingJob
    from uniap.runtime.launch import run_many

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    chosen = plans()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, plan in chosen.items():
            paths[name] = Path(tmp) / f"{len(paths)}.json"
            plan.save(paths[name])
        times: dict = {(name, impl): [] for name in chosen for impl in IMPLS}
        for r in range(args.rounds):  # A B in even rounds, B A in odd ones: the order's effect cancels
            keys = [(name, impl) for name in chosen for impl in (IMPLS if r % 2 == 0 else IMPLS[::-1])]
            jobs = [TrainingJob(str(paths[name]), steps=args.steps, impl=impl) for name, impl in keys]
            for key, result in zip(keys, run_many(jobs, nproc=4, timeout_s=300)):
                times[key].append(statistics.median(result["step_times_s"][WARMUP:]))
    print(f"{'plan':24s} {'uniap ms':>9s} {'transformers ms':>16s} {'ratio':>6s}   ratio per round "
          f"(medians of {args.rounds} rounds)")
    ratios = []
    for name in chosen:
        ours, theirs = (statistics.median(times[(name, impl)]) for impl in IMPLS)
        ratios.append(theirs / ours)
        rounds = " ".join(f"{b / a:.2f}" for a, b in zip(times[(name, "uniap")], times[(name, "transformers")]))
        print(f"{name:24s} {1e3 * ours:9.1f} {1e3 * theirs:16.1f} {theirs / ours:6.3f}   {rounds}")
    print(f"median ratio transformers / uniap: {statistics.median(ratios):.3f} (range {min(ratios):.3f}–"
          f"{max(ratios):.3f})")


if __name__ == "__main__":
    main()
