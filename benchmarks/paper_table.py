"""UniAP-paper-style comparison (Lin et al., "UniAP: Unifying Inter- and Intra-Layer Automatic Parallelism by
Mixed Integer Quadratic Programming"): throughput and search time of UniAP and the baselines, every method's
plan scored by the same cost model (`uniap compare`), on environments like the paper's.

    EnvA  titanxp-12g:1x8   8 × TITAN Xp 12 GB, PCIe, one node          (fp32)
    EnvB  titanxp-12g:4x4   4 nodes × 4 TITAN Xp 12 GB, slow network    (fp32)
    EnvC  a100-80g:1x8      8 × A100 80 GB, NVLink, one node            (bf16 mixed precision)

Models and global batches (the paper's models; batches of the sizes it uses, 16–128 by model):
BERT-Huge 32 (seq 512), T5-Large 16 (seq 512), ViT-Huge 128 (224², patch 16), Swin-Huge 128 (224²),
Llama-7B (llama2-7b) 16 at sequence 2048 — Llama only on EnvC, as in the paper: in fp32 with Adam it needs
~112 GB of model states, more than EnvA holds in total.

Run:  python benchmarks/paper_table.py [--time-limit S] [--envs A,B,C] [--models bert-huge,...] [--json out.json]
Prints a markdown table (throughput in samples/s, search time in s; OOM where no plan of that method fits).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from uniap.baselines import METHODS, compare
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload
from uniap.views import describe

ENVS = {
    "A": ("titanxp-12g:1x8", "fp32"),
    "B": ("titanxp-12g:4x4", "fp32"),
    "C": ("a100-80g:1x8", "bf16"),
}
MODELS = {  # name: (zoo name, global batch, sequence length or None for the model's own, environments)
    "BERT-Huge": ("bert-huge", 32, None, "ABC"),
    "T5-Large": ("t5-large", 16, None, "ABC"),
    "ViT-Huge": ("vit-huge", 128, None, "ABC"),
    "Swin-Huge": ("swin-huge", 128, None, "ABC"),
    "Llama-7B": ("llama2-7b", 16, 2048, "C"),
}


def cell(row: dict) -> str:
    if not row["fits"]:
        return "OOM"
    return f"{row['throughput_samples_per_s']:.2f} ({row['search_time_s']:.1f} s)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per UniAP search (default 60)")
    ap.add_argument("--envs", default="A,B,C")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--json", help="also write every row here")
    args = ap.parse_args(argv)
    envs = [e.strip().upper() for e in args.envs.split(",") if e.strip()]
    wanted = {m.strip().lower() for m in args.models.split(",") if m.strip()}
    models = {k: v for k, v in MODELS.items() if k.lower() in wanted or v[0] in wanted}

    start = time.perf_counter()
    results = []
    for env in envs:
        cluster_name, precision = ENVS[env]
        cluster = load_cluster(cluster_name)
        for label, (zoo, batch, seq, where) in models.items():
            if env not in where:
                continue
            spec = load_model(zoo, seq)
            t0 = time.perf_counter()
            out = compare(spec, cluster, Workload(batch, spec.seq_len, precision), schedule=args.schedule,
                          time_limit=args.time_limit, keep_plans=True)
            for row in out["rows"]:
                plan = row.pop("plan", None)
                row["plan_summary"] = describe(plan) if plan is not None else None
            results.append({**out, "env": env, "model": label, "zoo": zoo, "batch": batch})
            print(f"  Env{env} {label}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    methods = list(METHODS)
    print(f"Throughput in samples/s (search time); every plan costed by the same model, schedule {args.schedule}.\n")
    print("| Env | Model | Batch | " + " | ".join(methods) + " | UniAP vs best baseline |")
    print("|---|---|---:|" + "---:|" * len(methods) + "---:|")
    best_speedup = None
    for r in results:
        rows = {row["method"]: row for row in r["rows"]}
        others = [row for row in r["rows"] if row["method"] != "uniap" and row["speedup_of_uniap"] is not None]
        vs_best = f"{min(row['speedup_of_uniap'] for row in others):.2f}×" if others else "—"
        print(f"| Env{r['env']} | {r['model']} | {r['batch']} | "
              + " | ".join(cell(rows[m]) for m in methods) + f" | {vs_best} |")
        for row in others:
            if best_speedup is None or row["speedup_of_uniap"] > best_speedup[0]:
                best_speedup = (row["speedup_of_uniap"], r, row, rows["uniap"])
    per_method = {}
    for r in results:
        for row in r["rows"]:
            if row["method"] != "uniap" and row["speedup_of_uniap"] is not None:
                old = per_method.get(row["method"])
                if old is None or row["speedup_of_uniap"] > old[0]:
                    per_method[row["method"]] = (row["speedup_of_uniap"], f"Env{r['env']} {r['model']}")
    if per_method:
        print("\nLargest speed-up of UniAP over each method (where it fits): " + "; ".join(
            f"{m} {v:.2f}× ({where})" for m, (v, where) in per_method.items()) + ".")
    oom = {m: sum(not {row["method"]: row for row in r["rows"]}[m]["fits"] for r in results) for m in methods}
    print("\nOOM: no plan of that method fits in device memory (" +
          ", ".join(f"{m} {n}×" for m, n in oom.items() if n) + ").")
    if best_speedup is not None:
        s, r, row, ours = best_speedup
        print(f"\nLargest speed-up: {s:.2f}× over {row['method']} on Env{r['env']} {r['model']} (batch {r['batch']}): "
              f"{row['throughput_samples_per_s']:.2f} → {ours['throughput_samples_per_s']:.2f} samples/s.")
        print(f"- {row['method']} ({row['config']}): {row['plan_summary']}")
        print(f"- UniAP ({ours['config']}): {ours['plan_summary']}")
    print(f"\nTotal wall time {time.perf_counter() - start:.0f} s.")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
