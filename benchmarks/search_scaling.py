"""Search time of the UniAP planner against depth and devices, on the real cost model (this machine: 2 cores).

Three tables:
1. one MILP (one pipeline configuration), folded vs unfolded, as the number of identical blocks grows: a GPT with
   hidden 4096 on a100-80g:8x8, global batch 512, c = 16 micro-batches (unfolded capped at --unfolded-limit s);
2. the whole search (`uniap plan`: every pipeline degree × micro-batch count × virtual stages) against layers
   (12…128) and devices (8…4096): GPT with hidden 4096, sequence 2048, global batch max(512, devices);
3. the issue's targets: llama2-70b on a100-80g:8x8 (batch 512, seq 4096) ≤ 5 s proven optimal, and the
   1-trillion-parameter GPT (128 layers, hidden 25600) on a100-80g:384x8 (batch 3072) ≤ 60 s, gap ≤ 1 %; each
   searched with 1F1B alone and with interleaving too (the default), and the ratio of the two, and each returned
   plan's simulated over predicted time (the report's event simulation of its schedule; 1 when the formula the
   solver used is right for the plan it returned);
4. mixtures of experts: Mixtral-8x7B on h100-80g:8x8, Qwen3-235B-A22B on h100-80g:32x8 and DeepSeek-V3 on
   h800-80g:256x8 (≤ 60 s), each proven optimal over pp, v, the attention's tp and the experts' ep together; the
   predicted tokens/s per GPU next to the published layout's measured figure, and that layout costed by the same
   model (its best micro-batch size and recompute), so the gain is the plan's over the hand layout;
5. HiGHS's default options against ours (backends.HIGHS_SPEED) on the six most promising programs (least lower
   bound) of five model/cluster cases;
6. every distinct workload of benchmarks/data/published_runs.yaml that the cost model covers, planned with the
   default search: the ten slowest, and how many take more than 10 s (issue 23's limit).

Run: `python benchmarks/search_scaling.py` (`--quick` skips table 2's largest cells). Times vary ±50 % on a
shared machine; compare within one run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from dataclasses import replace
from concurrent.futures import ProcessPoolExecutor

from uniap.errors import UniapError
from uniap.estimate import estimate_uniform
from uniap.planner import build_candidate, candidates, plan_search
from uniap.report.render import recost, timeline_boxes
from uniap.report.timeline import makespan
from uniap.solve.backends import HIGHS_SPEED, HighsBackend, limit_threads
from uniap.solve.formulation import Formulation
from uniap.solve.milp import solve
from uniap.solve.program import lower_bound
from uniap.solve.reduce import reduce_program
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.spec.workload import Workload


def gpt(layers: int, hidden: int) -> ModelConfig:
    return ModelConfig(name=f"gpt-{layers}x{hidden}", family="gpt2", layers=layers, hidden=hidden, heads=hidden // 128,
                       ffn=4 * hidden, vocab=51200, max_seq=2048)


def single_program(args) -> None:
    print("1) one pipeline configuration: folded vs unfolded MILP (gpt, hidden 4096, a100-80g:8x8, B=512, c=16)")
    print(f"{'blocks':>6} {'P':>3} {'folded s':>9} {'unfolded s':>14} {'same optimum':>13}")
    cluster = load_cluster("a100-80g:8x8")
    for layers in (4, 8, 12, 24, 48, 96, 128):
        model = build_layers(gpt(layers, 4096), 2048)
        workload = Workload(512, 2048, "bf16")
        for stages in (2, 4, 8):
            if stages > len(model.layers):
                continue
            program = build_candidate((stages, 16, 1), model, cluster, workload, ("1f1b",), None)
            t = time.perf_counter()
            folded = solve(program)
            t_fold = time.perf_counter() - t
            unfolded_text, same = "skipped", ""
            if layers <= args.unfolded_max_layers:
                t = time.perf_counter()
                unfolded = solve(program, fold=False, time_limit=args.unfolded_limit)
                t_unfold = time.perf_counter() - t
                if unfolded is not None and unfolded.optimal:
                    unfolded_text = f"{t_unfold:.2f}"
                    same = str(abs(unfolded.objective - folded.objective) <= 1e-6 * folded.objective)
                else:
                    unfolded_text = f"timeout {args.unfolded_limit:.0f}"
            print(f"{layers:>6} {stages:>3} {t_fold:>9.2f} {unfolded_text:>14} {same:>13}", flush=True)


def whole_search(args) -> None:
    print("\n2) whole search (`uniap plan`): gpt hidden 4096, seq 2048, B = max(512, devices)")
    print(f"{'blocks':>6} {'devices':>7} {'candidates':>10} {'search s':>9} {'optimal':>8} {'gap':>8} {'P':>4} {'v':>3} "
          f"{'c':>5}")
    for devices in (8, 64, 512, 4096):
        for layers in (12, 32, 64, 128):
            if args.quick and devices * layers > 64 * 128:
                continue
            model = build_layers(gpt(layers, 4096), 2048)
            cluster = load_cluster(f"a100-80g:{max(devices // 8, 1)}x{min(devices, 8)}")
            workload = Workload(max(512, devices), 2048, "bf16")
            try:
                plan = plan_search(model, cluster, workload, time_limit=args.time_limit)
            except UniapError as exc:
                print(f"{layers:>6} {devices:>7}  {exc}", flush=True)
                continue
            s = plan.search
            print(f"{layers:>6} {devices:>7} {s['candidates']:>10} {s['time_s']:>9.2f} {str(s['optimal']):>8} "
                  f"{s['gap'] * 100:>7.3f}% {plan.pipeline.degree:>4} {plan.pipeline.virtual_stages:>3} "
                  f"{plan.pipeline.micro_batches:>5}",
                  flush=True)


def targets(args) -> None:
    print("\n3) targets: the default search (every schedule) against 1F1B alone and 1F1B with "
          "interleaving, one after the other")
    print(f"{'case':<34} {'1F1B s':>7} {'+IL s':>7} {'default s':>9} {'target s':>9} {'optimal':>8} {'gap':>8} "
          f"{'plan':>18} {'gain':>6} {'sim/pred 1F1B':>13} {'sim/pred plan':>13}")
    cases = [("llama2-70b a100-80g:8x8 B512 s4096", "llama2-70b", "a100-80g:8x8", 512, 4096, 5.0),
             ("gpt-1t a100-80g:384x8 B3072 s2048", "gpt-1t", "a100-80g:384x8", 3072, 2048, 60.0)]
    for label, name, cluster, batch, seq, target in cases:
        model = load_model(name, seq)
        runs = {}
        for schedule in ("1f1b", "interleaved-1f1b", "default"):
            runs[schedule] = plan_search(model, load_cluster(cluster), Workload(batch, seq, "bf16"),
                                         schedule=schedule, time_limit=args.time_limit)
        plain, best = runs["1f1b"], runs["default"]
        s, pipe = best.search, best.pipeline
        chosen = f"pp{pipe.degree}·v{pipe.virtual_stages} c{pipe.micro_batches} {pipe.schedule[:11]}"
        gain = plain.predicted["iteration_time_s"] / best.predicted["iteration_time_s"]
        agree = [f"{simulated_over_predicted(p, cluster):>13.4f}" for p in (plain, best)]
        print(f"{label:<34} {plain.search['time_s']:>7.2f} {runs['interleaved-1f1b'].search['time_s']:>7.2f} "
              f"{s['time_s']:>9.2f} {target:>9.0f} {str(s['optimal']):>8} {s['gap'] * 100:>7.3f}% {chosen:>18} "
              f"{gain:>5.3f}× {agree[0]} {agree[1]}", flush=True)


# Published layouts of the MoE targets: (tp, pp, virtual stages, ep, zero, measured tokens/s/GPU, what it was).
# Sources: benchmarks/data/published_runs.yaml rows mb2602-h100-qwen3-235b-a22b-fp8 (Megatron-Bridge 26.02,
# DGX-H100, FP8, force-balanced routing) and dsv3-report-pretrain-h800 (DeepSeek-V3 report: 2.664M H800 GPU-hours
# for 14.8T tokens, FP8, DualPipe, DeepEP). Mixtral-8x7B: no published layout on 64 H100 with a measured figure.
MOE_TARGETS = [
    ("mixtral-8x7b h100-80g:8x8 B256", "mixtral-8x7b", "h100-80g:8x8", 256, 4096, None, None),
    ("qwen3-235b-a22b h100-80g:32x8 B8192", "qwen3-235b-a22b", "h100-80g:32x8", 8192, 4096,
     (2, 8, 4, 32, 1), (1633, "Megatron-Bridge 26.02, fp8")),
    ("deepseek-v3 h800-80g:256x8 B15360", "deepseek-v3", "h800-80g:256x8", 15360, 4096,
     (1, 16, 1, 64, 1), (1543.2, "DeepSeek-V3 report, fp8 + DualPipe")),
]


def moe_targets(args) -> None:
    print("\n4) mixtures of experts: the default search over pp, v, tp and ep (bf16), against the published layout")
    print(f"{'case':<36} {'search s':>8} {'optimal':>8} {'plan':>26} {'tok/s/GPU':>9} {'layout costed':>13} "
          f"{'gain':>6} {'measured':>9}  source")
    for label, name, cluster_name, batch, seq, layout, published in MOE_TARGETS:
        model, cluster = load_model(name, seq), load_cluster(cluster_name)
        workload = Workload(batch, seq, "bf16")
        plan = plan_search(model, cluster, workload, time_limit=args.time_limit)
        pipe = plan.pipeline
        blocks = [layer.strategy for layer in plan.layers if layer.name.startswith("block.")]
        moe = max(blocks, key=lambda s: s.ep)
        chosen = (f"pp{pipe.degree}·v{pipe.virtual_stages} c{pipe.micro_batches} tp{moe.tp} "
                  f"ep{moe.ep}" + (f" etp{moe.etp}" if moe.etp > 1 else ""))
        per_gpu = plan.predicted["tokens_per_s"] / cluster.devices
        hand = best_layout(model, cluster, workload, layout) if layout else None
        hand_text = f"{hand:>13.0f}" if hand else f"{'-':>13}"
        gain = f"{per_gpu / hand:>5.2f}×" if hand else f"{'-':>6}"
        measured = f"{published[0]:>9.0f}  {published[1]}" if published else f"{'-':>9}"
        print(f"{label:<36} {plan.search['time_s']:>8.1f} {str(plan.search['optimal']):>8} {chosen:>26} "
              f"{per_gpu:>9.0f} {hand_text} {gain} {measured}", flush=True)


def best_layout(model, cluster, workload, layout) -> float | None:
    """Tokens/s per GPU of a published layout under the cost model: its tp, pp, v, ep and ZeRO stage, with the
    micro-batch size and recompute (none or full) that run fastest and fit; None when none fits."""
    tp, pp, virtual, ep, zero = layout
    best = None
    for mbs in (1, 2, 4, 8):
        for recompute in (False, True):
            try:
                plan = estimate_uniform(model, cluster, workload, tp=tp, pp=pp, zero=zero, micro_batch_size=mbs,
                                        recompute=recompute, sequence_parallel=tp > 1, ep=ep,
                                        schedule="interleaved-1f1b" if virtual > 1 else "1f1b",
                                        virtual_stages=virtual)
            except UniapError:
                continue
            if plan.predicted["fits"]:
                rate = plan.predicted["tokens_per_s"] / cluster.devices
                best = rate if best is None else max(best, rate)
    return best


def simulated_over_predicted(plan, cluster: str) -> float:
    """The report's event simulation of the plan's schedule over the time the planner predicted for it."""
    figures = recost(plan, cluster)
    return makespan(timeline_boxes(plan, figures)) / figures.tpi


PLAN_WITHIN_S = 10.0
"""Seconds a plan of any published workload should take at most (issue 23)."""


def published_workloads(args) -> None:
    print("\n6) every workload of benchmarks/data/published_runs.yaml, planned (default search, `--time-limit` each): "
          "the slowest", flush=True)
    from published_runs import cluster_of, load_rows, moe_imbalance, moe_model, row_setting

    seen: dict[tuple, str] = {}
    times = []
    for row in load_rows():
        if row.skip_reason() is not None:
            continue
        if row.is_moe:
            model, cluster = moe_model(row), cluster_of(row)
            workload = Workload(row.config["global_batch"], model.seq_len, row.config["precision"],
                                expert_imbalance=moe_imbalance(row))
        else:
            model, cluster, workload = row_setting(row)
        key = (replace(model.config, name=""), model.seq_len, cluster.name, cluster.engine, workload)
        if key in seen:  # several published layouts of one workload: one search
            continue
        seen[key] = row.id
        started = time.perf_counter()
        try:
            plan = plan_search(model, cluster, workload, time_limit=args.time_limit)
            result = "proven optimal" if plan.search["optimal"] else f"gap {plan.search['gap']:.2%}"
            count = plan.search["candidates"]
        except UniapError as exc:
            result, count = f"no plan: {exc}"[:60], 0
        times.append((time.perf_counter() - started, row.id, count, result))
        print(f"  {len(times):>3} {row.id:<40} {times[-1][0]:>7.2f} s", flush=True)
    times.sort(reverse=True)
    over = sum(1 for t in times if t[0] > PLAN_WITHIN_S)
    print(f"{'workload (first row of it)':<42} {'search s':>9} {'candidates':>10}  result")
    for seconds, row_id, count, result in times[:10]:
        print(f"{row_id:<42} {seconds:>9.2f} {count:>10}  {result}")
    print(f"{len(times)} distinct workloads; {over} took more than {PLAN_WITHIN_S:g} s", flush=True)


def highs_options(args) -> None:
    print("\n5) HiGHS options: defaults vs ours, one thread, no cut-off (seconds per MILP)", flush=True)
    # HiGHS fixes its thread count when it first runs in a process: a fresh one, with one thread as in the UOP.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn, initializer=limit_threads, initargs=(1,)) as pool:
        pool.submit(_options_rows, args.unfolded_limit).result()


def _options_rows(limit: float) -> None:
    print(f"{'case':<16} {'P':>4} {'c':>5} {'defaults':>9} {'ours':>7} {'same':>5}")
    cases = [("llama2-70b", load_model("llama2-70b", 4096), "a100-80g:8x8", Workload(512, 4096, "bf16")),
             ("gpt-1t", load_model("gpt-1t", 2048), "a100-80g:384x8", Workload(3072, 2048, "bf16")),
             ("bert-huge", load_model("bert-huge", 512), "titanxp-12g:2x8", Workload(64, 512, "fp32")),
             ("gpt-64x4096", build_layers(gpt(64, 4096), 2048), "a100-80g:8x8", Workload(512, 2048, "bf16")),
             ("gpt-32x4096", build_layers(gpt(32, 4096), 2048), "a100-80g:64x8", Workload(512, 2048, "bf16"))]
    totals = [0.0, 0.0]
    for label, model, cluster_name, workload in cases:
        cluster = load_cluster(cluster_name)
        programs = [build_candidate(c, model, cluster, workload, ("1f1b",), None)
                    for c in candidates(model, cluster, workload)]
        programs = sorted((p for p in programs if p is not None and lower_bound(p) < float("inf")), key=lower_bound)
        for program in programs[:6]:
            form = Formulation(program, reduce_program(program, fold=True))
            seconds, bounds = [], []
            for options in ({}, HIGHS_SPEED):
                t = time.perf_counter()
                result = HighsBackend(form.model, options).solve(limit, None, 0.0)
                seconds.append(time.perf_counter() - t)
                bounds.append(result.bound if result.status == "optimal" else float("nan"))
            totals = [a + b for a, b in zip(totals, seconds)]
            same = abs(bounds[0] - bounds[1]) <= 1e-6 * abs(bounds[0])
            print(f"{label:<16} {program.stages:>4} {program.micro_batches:>5} {seconds[0]:>9.2f} {seconds[1]:>7.2f} "
                  f"{str(same):>5}", flush=True)
    print(f"{'total':<27} {totals[0]:>9.2f} {totals[1]:>7.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the largest whole-search cells")
    parser.add_argument("--unfolded-limit", type=float, default=20.0,
                        help="seconds per unfolded MILP (and per MILP of table 4)")
    parser.add_argument("--unfolded-max-layers", type=int, default=12, help="deepest model tried unfolded")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per whole search")
    parser.add_argument("--only", choices=("single", "search", "targets", "moe", "options", "published"),
                        help="print one table")
    args = parser.parse_args()
    for name, table in (("single", single_program), ("search", whole_search), ("targets", targets),
                        ("moe", moe_targets), ("options", highs_options), ("published", published_workloads)):
        if args.only in (None, name):
            table(args)


if __name__ == "__main__":
    main()
