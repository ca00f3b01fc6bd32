"""Predicted vs published training throughput: the analytic cost model against the runs in
benchmarks/data/published_runs.yaml (Megatron-LM, torchtitan, llm-foundry, … — each row names its source).

Every row is costed as its source describes it (hardware, engine kernels and attention, tp/pp/dp, ZeRO,
micro-batch, recompute) with `estimate_uniform` — the same function as `uniap estimate`; no per-row
factors. Rows whose setting the model cannot represent (fp8, context parallelism, selective recomputation, a
configuration the source does not state — the interleaved schedule's virtual stages included) are listed with
the reason and not costed. Mixture-of-experts rows (model.experts > 0, with config.ep / config.etp) are listed the
same way until the expert cost model is wired in; their split is fixed by the rule in the data file's MoE block.

The rows carry a fixed `split`, chosen before anything was fitted: the constants marked "fitted" in
spec/cluster.py may be fitted on the calibration rows only (`--fit` searches them and prints the best);
the validation rows never enter a fit, and their error is reported on its own.

    python benchmarks/published_runs.py           # both tables; exit 1 if a row misses by > --tolerance
    python benchmarks/published_runs.py --fit     # grid search of the fitted constants on calibration rows
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from uniap.errors import UniapError
from uniap.estimate import estimate_uniform
from uniap.spec.cluster import DEVICE_TYPES, ClusterSpec
from uniap.spec.engine import Engine
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.spec.workload import Workload

DATA = Path(__file__).parent / "data" / "published_runs.yaml"
SPLITS = ("calibration", "validation")


@dataclass(frozen=True)
class Row:
    data: dict

    @property
    def id(self) -> str:
        return self.data["id"]

    @property
    def split(self) -> str:
        return self.data["split"]

    @property
    def config(self) -> dict:
        return self.data["config"]

    @property
    def is_moe(self) -> bool:
        return (self.data["model"].get("experts") or 0) > 0

    def skip_reason(self) -> str | None:
        """Why this row is not costed (None: it is)."""
        c, d = self.config, self.data
        if not d.get("confirmed", True):
            return "figure not confirmed from its source"
        if c.get("precision") == "fp8":
            return "fp8 training is not modelled"
        if (c.get("cp") or 1) > 1:
            return "context parallelism is not modelled"
        if self.is_moe:
            # Mixture-of-experts rows (model.experts > 0; config.ep, config.etp): recorded with their fixed split,
            # not costed until the expert cost model is wired in here; the reasons say what else they need.
            if c.get("token_drop"):
                return "MoE: token dropping (a capacity factor) is not modelled"
            if c.get("precision") is None:
                return "MoE: the source does not state the precision"
            if c.get("schedule") not in (None, "1f1b", "interleaved-1f1b"):
                return f"MoE: the {c['schedule']} pipeline schedule is not modelled"
            return "MoE: the expert cost model is not wired into this script yet"
        if c["pp"] > 1 and c.get("virtual_stages") is None:
            return "the source does not state the interleaved schedule's virtual stages"
        if c.get("recompute") == "selective":
            return "selective recomputation is not modelled (a layer recomputes all or nothing)"
        unstated = [k for k in ("zero", "recompute") if c.get(k) is None]
        unstated += [k for k in ("kernels", "attention") if d.get(k) is None]
        if unstated:
            return f"the source does not state {', '.join(unstated)}"
        return None


def load_rows(path: Path = DATA) -> list[Row]:
    rows = [Row(r) for r in yaml.safe_load(path.read_text())]
    bad = [r.id for r in rows if r.data.get("split") not in SPLITS]
    if bad:
        raise UniapError(f"{path}: rows without a split: {', '.join(bad)}")
    return rows


def model_of(row: Row) -> ModelConfig:
    """The architecture as the source describes it: Llama-style (gated MLP, RMSNorm, RoPE, no biases), MPT
    (llm-foundry: ALiBi, no biases, LayerNorm) or Megatron GPT (learned positions, biases, LayerNorm)."""
    m = row.data["model"]
    common = dict(name=row.id, layers=m["layers"], hidden=m["hidden"], heads=m["heads"], ffn=m["ffn"],
                  vocab=m["vocab"], kv_heads=m.get("kv_heads") or 0, max_seq=m["seq_len"],
                  tied_embeddings=bool(m.get("tied_embeddings")))
    if m.get("gated_mlp"):
        return ModelConfig(family="llama", gated_mlp=True, norm="rmsnorm", bias=False, learned_positions=False,
                           **common)
    if row.data["engine"] == "llm-foundry":
        return ModelConfig(family="gpt2", bias=False, learned_positions=False, **common)
    return ModelConfig(family="gpt2", **common)


def cluster_of(row: Row, device_overrides: dict | None = None) -> ClusterSpec:
    device = DEVICE_TYPES[row.data["hardware"]]
    if device_overrides:
        device = replace(device, **device_overrides.get(row.data["hardware"], {}), **device_overrides.get("*", {}))
    per_node = int(row.data.get("gpus_per_node") or 8)
    engine = Engine(kernels=row.data["kernels"], attention=row.data["attention"])
    return ClusterSpec(name=f"{row.data['hardware']}:{row.data['gpus'] // per_node}x{per_node}",
                       nodes=row.data["gpus"] // per_node, devices_per_node=per_node, device=device, engine=engine)


def measured_time(row: Row) -> float:
    """The published figure as seconds per iteration, through the source's own FLOP formula."""
    c, m, me = row.config, row.data["model"], row.data["measured"]
    B, s, l, h, V, n = c["global_batch"], m["seq_len"], m["layers"], m["hidden"], m["vocab"], row.data["gpus"]
    value = float(me["value"])
    if me["metric"] == "iteration_time_s":
        return value
    if me["metric"] == "tokens_per_s_per_gpu":
        return B * s / (value * n)
    if me["metric"] == "hardware_tflops_per_gpu":  # Narayanan et al. 2021, eq. 3 (full recompute)
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)) / (value * 1e12 * n)
    if me["metric"] == "mfu":  # Korthikanti et al. 2022, App. A: model FLOPs over A100 peak
        return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * h * l)) / (value * 312e12 * n)
    raise UniapError(f"{row.id}: no formula for metric {me['metric']!r}")


def predict(row: Row, device_overrides: dict | None = None) -> tuple[float, bool, float]:
    """(predicted seconds per iteration, fits in memory, predicted MFU)."""
    c = row.config
    model = build_layers(model_of(row), row.data["model"]["seq_len"])
    cluster = cluster_of(row, device_overrides)
    precision = "bf16" if c.get("precision") in (None, "bf16") else c["precision"]
    workload = Workload(c["global_batch"], model.seq_len, precision)
    v = int(c.get("virtual_stages") or 1) if c["pp"] > 1 else 1
    plan = estimate_uniform(model, cluster, workload, tp=c["tp"], pp=c["pp"], dp=c["dp"], zero=c["zero"],
                            micro_batch_size=c.get("micro_batch_size") or 1, recompute=c["recompute"] == "full",
                            sequence_parallel=bool(c.get("sequence_parallel")) and c["tp"] > 1,
                            schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual_stages=v)
    p = plan.predicted
    return p["iteration_time_s"], p["fits"], p["mfu"]


def errors(rows: list[Row], device_overrides: dict | None = None) -> list[tuple[Row, float, float, bool, float]]:
    """(row, measured s, predicted s, fits, mfu) for every costed row."""
    out = []
    for row in rows:
        if row.skip_reason() is None:
            predicted, fits, mfu = predict(row, device_overrides)
            out.append((row, measured_time(row), predicted, fits, mfu))
    return out


def print_table(title: str, results) -> float:
    print(f"\n{title}")
    header = (f"{'row':<34} {'hw':<8} {'GPUs':>5} {'kernels':<7} {'tp':>2} {'pp':>2} {'v':>1} {'dp':>4} {'z':>1} {'rc':<4} "
              f"{'published s':>11} {'predicted s':>11} {'error':>7} {'MFU':>5}")
    print(header)
    print("-" * len(header))
    worst = 0.0
    for row, measured, predicted, fits, mfu in results:
        c = row.config
        err = predicted / measured - 1
        worst = max(worst, abs(err))
        print(f"{row.id:<34} {row.data['hardware']:<8} {row.data['gpus']:>5} {row.data['kernels']:<7} {c['tp']:>2} "
              f"{c['pp']:>2} {c.get('virtual_stages') or 1:>1} {c['dp']:>4} {c['zero']:>1} {c['recompute'][:4]:<4} {measured:>11.3f} {predicted:>11.3f} "
              f"{err * 100:>+6.1f}% {mfu * 100:>4.0f}%" + ("" if fits else "  (does not fit)"))
    errs = [abs(p / m - 1) for _, m, p, _, _ in results]
    median = sorted(errs)[len(errs) // 2] if errs else 0.0
    print(f"{len(results)} rows: median |error| {median * 100:.1f}%, largest {worst * 100:.1f}%")
    return worst


# The fitted constants (spec/cluster.py) and the grid `--fit` searches: per-device GEMM efficiency, the
# overlap slowdown.
GRID = {
    ("a100-80g", "gemm_efficiency"): [0.60 + 0.025 * i for i in range(9)],
    ("h100-80g", "gemm_efficiency"): [0.45 + 0.025 * i for i in range(9)],
    ("*", "overlap_slowdown"): [0.0, 0.1, 0.2, 0.3],
}


def overrides_of(keys, values) -> dict:
    out: dict = {}
    for (hw, name), value in zip(keys, values):
        out.setdefault(hw, {})[name] = value
        # one chip, one GEMM efficiency: the A100 40 GB part and the 500 W H100 share their sibling's
        sibling = {"a100-80g": "a100-40g", "h100-80g": "h100-96g"}.get(hw)
        if sibling:
            out.setdefault(sibling, {})[name] = value
    return out


def fit(rows: list[Row]) -> dict:
    """The grid point with the least mean squared log error over the calibration rows (validation never seen)."""
    calibration = [r for r in rows if r.split == "calibration"]
    keys = list(GRID)
    best, best_point = math.inf, None
    for values in itertools.product(*(GRID[k] for k in keys)):
        res = errors(calibration, overrides_of(keys, values))
        loss = sum(math.log(p / m) ** 2 for _, m, p, _, _ in res) / len(res)
        if loss < best:
            best, best_point = loss, values
    print("fitted on", sum(r.skip_reason() is None for r in calibration), "calibration rows (rms log error "
          f"{math.sqrt(best) * 100:.1f}%):")
    for (hw, name), value in zip(keys, best_point):
        print(f"  {hw} {name} = {value:.3f}")
    return overrides_of(keys, best_point)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--fit", action="store_true", help="Grid-search the fitted constants on calibration rows.")
    args = parser.parse_args()
    rows = load_rows()
    overrides = fit(rows) if args.fit else None
    worst = 0.0
    for split in SPLITS:
        results = errors([r for r in rows if r.split == split], overrides)
        worst = max(worst, print_table(f"{split} rows" + (" (fitted on these)" if split == "calibration" else
                                                         " (never fitted on)"), results))
    skipped = [(r, r.skip_reason()) for r in rows if r.skip_reason()]
    print(f"\nnot costed ({len(skipped)} rows):")
    for reason in sorted({why for _, why in skipped}):
        ids = [r.id for r, why in skipped if why == reason]
        print(f"  {reason}: {', '.join(ids)}")
    print(f"\nlargest |error| over both splits: {worst * 100:.1f}% (target ≤ {args.tolerance * 100:.0f}%)")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
