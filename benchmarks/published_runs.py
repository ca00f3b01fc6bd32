"""Predicted vs published training throughput: the analytic cost model against the runs in
benchmarks/data/published_runs.yaml (Megatron-LM, torchtitan, llm-foundry, … — each row names its source).

Every row is costed as its source describes it (hardware, engine kernels and attention, tp/pp/dp, ZeRO,
micro-batch, recompute, context parallelism, fp8) with `estimate_uniform` — the same function as `uniap
estimate`; no per-row factors. Selective recomputation is priced as the engine runs it: Megatron-LM / NeMo's
(`recompute_modules` unset or [core_attn]) as the attention core, torchtitan's `selective_ac_option: "op"` as its
op policy (`selective-op`). Rows whose setting the model cannot represent (torchtitan's every-N-th-layer
checkpointing with N unstated, a configuration the source does not state — the interleaved schedule's virtual
stages included) are listed with the reason and not costed.

Mixture-of-experts rows (model.experts > 0, with config.ep / config.etp) are costed the same way, on their own:
the architecture is the stored Hugging Face config (or zoo preset) the row's `hf_config` names, so gpt-oss keeps
its sliding windows, sinks and biases and DeepSeek-V3 its MLA; the layout adds ep and etp (null: etp = tp,
Megatron-Core's default); a row whose source force-balances the routing (config.force_load_balancing) is costed
with Workload.expert_imbalance = 1.0, the others with the default. Settings the published table leaves out are
taken from the recipe that produced the row (`recipe_source`) or the row is not costed. Selective recomputation
of only elementwise modules (Megatron-Core's "layernorm", "moe_act": norms and the expert activation, no GEMM) is
priced as no recomputation, a lower bound on its time, and marked in the table. MoE rows print their own table and
error summary (calibration and validation apart); they never enter the dense figures, the fit or the exit status.
Their split is fixed by the rule in the data file's MoE block.

The rows carry a fixed `split`, chosen before anything was fitted: the constants marked "fitted" in
spec/cluster.py may be fitted on the calibration rows only (`--fit` searches them and prints the best);
the validation rows never enter a fit, and their error is reported on its own. The fp8 GEMM efficiency is fitted
after the others, on the fp8 calibration rows alone, with the bf16 constants held at their fitted values.

    python benchmarks/published_runs.py           # both tables; exit 1 if a row misses by > --tolerance
    python benchmarks/published_runs.py --fit     # grid search of the fitted constants on calibration rows
    python benchmarks/published_runs.py --versus-planner   # + how much faster `uniap plan`'s plan is (same model)
    python benchmarks/published_runs.py --ring-step-grid   # + calibration / validation error over a grid of
                                                           #   cost.tables.RING_STEP_ACROSS_NODES_S (checked, not fitted)

After the two tables it prints the data-parallel check of the cost model's collectives at scale: every costed row on
512 GPUs or more without pipeline stages (pure data parallelism or FSDP, with its micro-batches per step), and how
step time grows with the GPU count at the same per-GPU work (llm-foundry's 128 / 256 / 512-GPU series, one
micro-batch per step), published against predicted.
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
from uniap.planner import plan_search
from uniap.spec import load_model
from uniap.spec.cluster import DEVICE_TYPES, ClusterSpec
from uniap.spec.engine import Engine
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig, ModelSpec
from uniap.spec.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "published_runs.yaml"
SPLITS = ("calibration", "validation")
# Megatron-Core selective-recompute modules that recompute no GEMM (the block's norms; the expert activation):
# an MoE row recomputing only these is priced as recomputing nothing (a lower bound on its time).
ELEMENTWISE_RECOMPUTE = frozenset({"layernorm", "moe_act"})


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
        if self.is_moe:
            why = self.moe_skip_reasons()
            return "MoE: " + "; ".join(why) if why else None
        if c["pp"] > 1 and c.get("virtual_stages") is None:
            return "the source does not state the interleaved schedule's virtual stages"
        if c.get("fp8_recipe") == "torchao-rowwise":
            return "fp8 with row-wise scaling is not modelled (its GEMMs and casts are priced as tensor-wise)"
        if c.get("recompute") == "selective" and self.recompute_level() is None:
            return "the source does not state which selective recomputation (torchtitan: per op or every N-th layer)"
        unstated = [k for k in ("zero", "recompute") if c.get(k) is None]
        unstated += [k for k in ("kernels", "attention") if d.get(k) is None]
        if unstated:
            return f"the source does not state {', '.join(unstated)}"
        return None


    def recompute_level(self) -> str | None:
        """The row's recompute as a Strategy level (None: a selective kind the source leaves unstated)."""
        c = self.config
        if c.get("recompute") != "selective":
            return c.get("recompute")
        if self.data["engine"] == "torchtitan":
            return "selective-op" if c.get("selective_ac_option") == "op" else None
        modules = c.get("recompute_modules")
        return "selective" if modules in (None, ["core_attn"]) else None

    def moe_skip_reasons(self) -> list[str]:
        """Everything that keeps an MoE row (model.experts > 0; config.ep, config.etp) from being costed. Settings
        the published table leaves out come from the recipe its recipe_source names, or the row is not costed."""
        c, d = self.config, self.data
        out = []
        if c.get("precision") is None:
            out.append("the source does not state the precision")
        if c.get("token_drop"):
            out.append("token dropping (a capacity factor) is not modelled")
        if c.get("schedule") not in (None, "1f1b", "interleaved-1f1b"):
            out.append(f"the {c['schedule']} pipeline schedule is not modelled")
        elif c["pp"] > 1 and c.get("virtual_stages") is None:
            out.append("the source does not state the interleaved schedule's virtual stages")
        modules = set(c.get("recompute_modules") or ())
        if c.get("recompute") == "selective" and not (modules and modules <= ELEMENTWISE_RECOMPUTE):
            out.append(f"selective recomputation of {', '.join(c.get('recompute_modules') or ['unstated modules'])} "
                       "is not modelled")
        unstated = [k for k in ("zero", "recompute", "micro_batch_size") if c.get(k) is None]
        unstated += [k for k in ("kernels", "attention") if d.get(k) is None]
        if unstated:
            out.append(f"neither the source nor a recipe states {', '.join(unstated)}")
        if not d.get("hf_config"):
            out.append("no stored Hugging Face config or zoo preset names the architecture")
        return out


def load_rows(path: Path = DATA) -> list[Row]:
    rows = [Row(r) for r in yaml.safe_load(path.read_text())]
    bad = [r.id for r in rows if r.data.get("split") not in SPLITS]
    if bad:
        raise UniapError(f"{path}: rows without a split: {', '.join(bad)}")
    return rows


def moe_model(row: Row) -> ModelSpec:
    """An MoE row's exact architecture: the stored Hugging Face config (`hf_config`, a path from the repository
    root) or zoo preset ("zoo:<name>") of the same model, at the row's sequence length. The row's abbreviated
    shape must agree with it."""
    ref, m = row.data["hf_config"], row.data["model"]
    spec = load_model(ref[4:] if ref.startswith("zoo:") else ROOT / ref, m["seq_len"])
    cfg = spec.config
    mismatched = [k for k, mine in (("layers", cfg.layers), ("hidden", cfg.hidden), ("heads", cfg.heads),
                                    ("vocab", cfg.vocab), ("experts", cfg.experts),
                                    ("experts_per_token", cfg.experts_per_token), ("expert_ffn", cfg.expert_ffn),
                                    ("shared_ffn", cfg.shared_ffn))
                  if m.get(k) is not None and m[k] != mine]
    if (m.get("dense_layers") or 0) != cfg.layers - len(cfg.moe_layers):
        mismatched.append("dense_layers")
    if mismatched:
        raise UniapError(f"{row.id}: the row's {', '.join(mismatched)} disagree with {ref}")
    return spec


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
    # torchtitan attends through PyTorch SDPA (FlashAttention-2) with or without torch.compile
    attention = "sdpa" if row.data["engine"] == "torchtitan" and row.data["attention"] == "flash" else \
        row.data["attention"]
    engine = Engine(kernels=row.data["kernels"], attention=attention, tp_overlap=bool(row.config.get("tp_comm_overlap")))
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


def row_setting(row: Row, device_overrides: dict | None = None) -> tuple[ModelSpec, ClusterSpec, Workload]:
    """The model, cluster (with the row's engine) and workload a dense row is costed on."""
    c = row.config
    model = build_layers(model_of(row), row.data["model"]["seq_len"])
    precision = "bf16" if c.get("precision") in (None, "bf16") else c["precision"]
    return model, cluster_of(row, device_overrides), Workload(c["global_batch"], model.seq_len, precision)


def planner_speedup(row: Row, hand_s: float, time_limit: float) -> tuple[float, str]:
    """(hand layout's predicted time / the planner's, the planner's plan in brief) under the same cost model."""
    model, cluster, workload = row_setting(row)
    try:
        plan = plan_search(model, cluster, workload, time_limit=time_limit, workers=1)
    except UniapError as exc:
        return math.nan, str(exc)[:40]
    blocks = {layer.strategy.label() for layer in plan.layers if layer.name.startswith("block")}
    brief = f"pp{plan.pipeline.degree} " + ",".join(sorted(blocks))
    return hand_s / plan.predicted["iteration_time_s"], brief


def predict(row: Row, device_overrides: dict | None = None) -> tuple[float, bool, float]:
    """(predicted seconds per iteration, fits in memory, predicted MFU)."""
    c = row.config
    model, cluster, workload = row_setting(row, device_overrides)
    v = int(c.get("virtual_stages") or 1) if c["pp"] > 1 else 1
    plan = estimate_uniform(model, cluster, workload, tp=c["tp"], pp=c["pp"], dp=c["dp"], zero=c["zero"],
                            micro_batch_size=c.get("micro_batch_size") or 1, recompute=row.recompute_level(),
                            sequence_parallel=bool(c.get("sequence_parallel")) and c["tp"] > 1,
                            schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual_stages=v,
                            cp=int(c.get("cp") or 1))
    p = plan.predicted
    return p["iteration_time_s"], p["fits"], p["mfu"]


def errors(rows: list[Row], device_overrides: dict | None = None) -> list[tuple[Row, float, float, bool, float]]:
    """(row, measured s, predicted s, fits, mfu) for every costed dense row (MoE rows: `moe_errors`)."""
    out = []
    for row in rows:
        if not row.is_moe and row.skip_reason() is None:
            predicted, fits, mfu = predict(row, device_overrides)
            out.append((row, measured_time(row), predicted, fits, mfu))
    return out


def moe_layout(row: Row) -> dict:
    """An MoE row's layout as estimate_uniform takes it (etp null: = tp, Megatron-Core's default)."""
    c = row.config
    v = int(c.get("virtual_stages") or 1) if c["pp"] > 1 else 1
    return dict(tp=c["tp"], pp=c["pp"], dp=c["dp"], ep=c["ep"], etp=c["etp"] if c.get("etp") else c["tp"],
                zero=c["zero"], micro_batch_size=c["micro_batch_size"], recompute=c["recompute"] == "full", cp=int(c.get("cp") or 1),
                sequence_parallel=bool(c.get("sequence_parallel")) and c["tp"] > 1,
                schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual_stages=v)


def moe_imbalance(row: Row) -> float:
    """1.0 where the source force-balances the routing, else the cost model's default."""
    return 1.0 if row.config.get("force_load_balancing") else Workload(1, 1).expert_imbalance


def predict_moe(row: Row) -> tuple[float, bool, float]:
    """(predicted seconds per iteration, fits in memory, predicted MFU) of a costable MoE row."""
    model = moe_model(row)
    workload = Workload(row.config["global_batch"], model.seq_len, row.config["precision"],
                        expert_imbalance=moe_imbalance(row))
    p = estimate_uniform(model, cluster_of(row), workload, **moe_layout(row)).predicted
    return p["iteration_time_s"], p["fits"], p["mfu"]


def moe_errors(rows: list[Row]) -> list[tuple[Row, float, float, bool, float]]:
    """(row, measured s, predicted s, fits, mfu) for every costed MoE row."""
    out = []
    for row in rows:
        if row.is_moe and row.skip_reason() is None:
            predicted, fits, mfu = predict_moe(row)
            out.append((row, measured_time(row), predicted, fits, mfu))
    return out


def summary(results) -> tuple[float, float]:
    """(median, largest) |error| of (row, measured, predicted, ...) results (the upper median, as print_table)."""
    errs = sorted(abs(p / m - 1) for _, m, p, *_ in results)
    return (errs[len(errs) // 2], errs[-1]) if errs else (0.0, 0.0)


def print_moe_table(title: str, results) -> None:
    print(f"\n{title}")
    header = (f"{'row':<34} {'hw':<8} {'GPUs':>5} {'tp':>2} {'pp':>2} {'v':>2} {'dp':>3} {'ep':>3} {'etp':>3} "
              f"{'mbs':>3} {'z':>1} {'rc':<5} {'rho':>4} {'published s':>11} {'predicted s':>11} {'error':>7} {'MFU':>5}")
    print(header)
    print("-" * len(header))
    for row, measured, predicted, fits, mfu in results:
        c, lay = row.config, moe_layout(row)
        rc = "sel*" if c["recompute"] == "selective" else c["recompute"][:4]
        print(f"{row.id:<34} {row.data['hardware']:<8} {row.data['gpus']:>5} {lay['tp']:>2} {lay['pp']:>2} "
              f"{lay['virtual_stages']:>2} {lay['dp']:>3} {lay['ep']:>3} {lay['etp']:>3} {lay['micro_batch_size']:>3} "
              f"{lay['zero']:>1} {rc:<5} {moe_imbalance(row):>4.2f} {measured:>11.3f} {predicted:>11.3f} "
              f"{(predicted / measured - 1) * 100:>+6.1f}% {mfu * 100:>4.0f}%" + ("" if fits else "  (does not fit)"))
    median, worst = summary(results)
    print(f"{len(results)} rows: median |error| {median * 100:.1f}%, largest {worst * 100:.1f}%")


def print_moe(rows: list[Row]) -> None:
    """The MoE rows on their own: a table and an error summary per split, then those not costed (not gated)."""
    moe = [r for r in rows if r.is_moe]
    print("\n=== mixture-of-experts rows (own split rule; nothing MoE-specific is fitted; not gated) ===")
    for split in SPLITS:
        print_moe_table(f"MoE {split} rows", moe_errors([r for r in moe if r.split == split]))
    balanced = [r.id for r in moe if r.skip_reason() is None and r.config.get("force_load_balancing")]
    if balanced:
        print(f"\nexpert imbalance rho = 1.0 (the source force-balances the routing): {', '.join(balanced)}")
    if any(r.skip_reason() is None and r.config.get("recompute") == "selective" for r in moe):
        print("rc sel*: selective recomputation of elementwise modules only (layernorm, moe_act), priced as none "
              "(a lower bound on its time)")
    skipped = [(r, r.skip_reason()) for r in moe if r.skip_reason()]
    print(f"\nMoE rows not costed ({len(skipped)} rows):")
    for reason in sorted({why for _, why in skipped}):
        print(f"  {reason}: {', '.join(r.id for r, why in skipped if why == reason)}")


def print_table(title: str, results) -> float:
    print(f"\n{title}")
    header = (f"{'row':<40} {'hw':<8} {'GPUs':>5} {'kernels':<7} {'prec':<4} {'tp':>2} {'cp':>2} {'pp':>2} {'v':>2} "
              f"{'dp':>4} {'z':>1} {'rc':<5} {'published s':>11} {'predicted s':>11} {'error':>7} {'MFU':>5}")
    print(header)
    print("-" * len(header))
    worst = 0.0
    for row, measured, predicted, fits, mfu in results:
        c = row.config
        err = predicted / measured - 1
        worst = max(worst, abs(err))
        rc = {"none": "none", "selective": "sel", "selective-op": "selop", "full": "full"}[row.recompute_level()]
        print(f"{row.id:<40} {row.data['hardware']:<8} {row.data['gpus']:>5} {row.data['kernels']:<7} "
              f"{(c.get('precision') or 'bf16'):<4} {c['tp']:>2} {c.get('cp') or 1:>2} {c['pp']:>2} "
              f"{c.get('virtual_stages') or 1:>2} {c['dp']:>4} {c['zero']:>1} {rc:<5} {measured:>11.3f} "
              f"{predicted:>11.3f} {err * 100:>+6.1f}% {mfu * 100:>4.0f}%" + ("" if fits else "  (does not fit)"))
    errs = [abs(p / m - 1) for _, m, p, _, _ in results]
    median = sorted(errs)[len(errs) // 2] if errs else 0.0
    print(f"{len(results)} rows: median |error| {median * 100:.1f}%, largest {worst * 100:.1f}%")
    return worst


def micro_batches_per_step(row: Row) -> int:
    c = row.config
    return c["global_batch"] // (c["dp"] * (c.get("micro_batch_size") or 1))


def print_data_parallel_at_scale(results) -> None:
    """The costed rows on 512 GPUs or more with no pipeline (pure data parallelism or FSDP, tp allowed), and the
    scaling of every series of rows that differ only in GPU count (same model, per-GPU micro-batch, ZeRO, recompute):
    the published step time against the series' smallest run, beside the predicted one."""
    big = [(r, m, p) for r, m, p, *_ in results if r.data["gpus"] >= 512 and r.config["pp"] == 1]
    print("\ndata parallelism / FSDP on >= 512 GPUs (no pipeline; micro = micro-batches per step)")
    header = f"{'row':<40} {'split':<11} {'GPUs':>5} {'tp':>2} {'dp':>4} {'z':>1} {'micro':>5} {'published s':>11} " \
             f"{'predicted s':>11} {'error':>7}"
    print(header)
    print("-" * len(header))
    for r, m, p in big:
        c = r.config
        print(f"{r.id:<40} {r.split:<11} {r.data['gpus']:>5} {c['tp']:>2} {c['dp']:>4} {c['zero']:>1} "
              f"{micro_batches_per_step(r):>5} {m:>11.3f} {p:>11.3f} {(p / m - 1) * 100:>+6.1f}%")
    series: dict = {}
    for r, m, p, *_ in results:
        c = r.config
        key = (r.data["hardware"], r.data["engine"], repr(sorted(r.data["model"].items())), c["tp"], c["pp"],
               c.get("micro_batch_size"), micro_batches_per_step(r), c["zero"], r.recompute_level(), c.get("precision"))
        if c["pp"] == 1 and c["global_batch"] == c["dp"] * (c.get("micro_batch_size") or 1) * micro_batches_per_step(r):
            series.setdefault(key, []).append((r, m, p))
    print("\nscaling at the same per-GPU work: step time over the series' smallest run (published, predicted)")
    header = f"{'row':<40} {'GPUs':>5} {'micro':>5} {'published x':>11} {'predicted x':>11} {'error':>7}"
    print(header)
    print("-" * len(header))
    for runs in series.values():
        runs = sorted(runs, key=lambda t: t[0].data["gpus"])
        if len(runs) < 2 or runs[-1][0].data["gpus"] < 512:
            continue
        _, m0, p0 = runs[0]
        for r, m, p in runs:
            print(f"{r.id:<40} {r.data['gpus']:>5} {micro_batches_per_step(r):>5} {m / m0:>11.3f} {p / p0:>11.3f} "
                  f"{(p / p0) / (m / m0) * 100 - 100:>+6.1f}%")


# The per-step latency of an all-gather / reduce-scatter ring across nodes that --ring-step-grid tries (seconds).
RING_STEP_GRID = [0.0, 4e-6, 8e-6, 10e-6, 14e-6, 17e-6, 20e-6, 25e-6]


def print_ring_step_grid(rows: list[Row]) -> None:
    """Calibration mean squared log error and both splits' |error| over RING_STEP_GRID: the check of
    cost.tables.RING_STEP_ACROSS_NODES_S (NCCL's 14 µs, not fitted), validation printed beside it."""
    from uniap.cost import tables

    dense = [r for r in rows if not r.is_moe]
    held = tables.RING_STEP_ACROSS_NODES_S
    print(f"\nall-gather / reduce-scatter ring step across nodes (cost.tables.RING_STEP_ACROSS_NODES_S = "
          f"{held * 1e6:.0f} µs):")
    print(f"{'step µs':>7} {'cal msle':>9} {'cal median':>10} {'cal largest':>11} {'val median':>10} {'val largest':>11}"
          "   (msle: mean squared log error ×10⁴)")
    decline = tables.FABRIC_DECLINE
    try:
        for step, fabric in [(step, decline) for step in RING_STEP_GRID] + [(held, 0.0)]:
            tables.RING_STEP_ACROSS_NODES_S, tables.FABRIC_DECLINE = step, fabric
            res = errors(dense)
            cal = [(r, m, p) for r, m, p, *_ in res if r.split == "calibration"]
            val = [(r, m, p) for r, m, p, *_ in res if r.split == "validation"]
            msle = sum(math.log(p / m) ** 2 for _, m, p in cal) / len(cal)
            (cm, cw), (vm, vw) = summary(cal), summary(val)
            print(f"{step * 1e6:>7.0f} {msle * 1e4:>9.2f} {cm * 100:>9.1f}% {cw * 100:>10.1f}% {vm * 100:>9.1f}% "
                  f"{vw * 100:>10.1f}%" + ("  (without cost.tables.fabric_share)" if not fabric else ""))
    finally:
        tables.RING_STEP_ACROSS_NODES_S, tables.FABRIC_DECLINE = held, decline


def print_versus_planner(rows: list[Row], overrides: dict | None, search_time: float) -> None:
    """Each costed dense row's published layout against `uniap plan`'s on the same workload, under the same model
    (the levers searched: recompute levels, cp, the row's precision and engine)."""
    print("\npublished layout vs the planner's plan (same cost model; speedup = layout's predicted / plan's)")
    header = f"{'row':<40} {'layout s':>9} {'plan s':>9} {'speedup':>8}  plan"
    print(header)
    print("-" * len(header))
    speedups = []
    for row, _, predicted, _, _ in errors(rows, overrides):
        speedup, brief = planner_speedup(row, predicted, search_time)
        speedups.append(speedup)
        print(f"{row.id:<40} {predicted:>9.3f} {predicted / speedup:>9.3f} {speedup:>7.2f}×  {brief}", flush=True)
    good = sorted(x for x in speedups if x == x)
    if good:
        print(f"{len(good)} rows: median speedup {good[len(good) // 2]:.2f}×, least {good[0]:.2f}×, most {good[-1]:.2f}×")


# The fitted constants (spec/cluster.py) and the grid `--fit` searches: per-device GEMM efficiency, the
# overlap slowdown.
GRID = {
    ("a100-80g", "gemm_efficiency"): [0.60 + 0.025 * i for i in range(9)],
    ("h100-80g", "gemm_efficiency"): [0.45 + 0.025 * i for i in range(9)],
    ("*", "overlap_slowdown"): [0.0, 0.1, 0.2, 0.3],
}
# fitted second, on the fp8 calibration rows alone (the bf16 constants above held at their fitted values)
FP8_GRID = {("h100-80g", "fp8_gemm_efficiency"): [0.30 + 0.025 * i for i in range(17)]}


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
    """The grid point with the least mean squared log error over the calibration rows (validation never seen):
    GRID on the 16-bit rows, then FP8_GRID on the fp8 rows with GRID's values held."""
    calibration = [r for r in rows if r.split == "calibration" and not r.is_moe and r.skip_reason() is None]
    fp8 = [r for r in calibration if r.config.get("precision") == "fp8"]
    fitted = _grid_fit(GRID, [r for r in calibration if r not in fp8], {})
    return _grid_fit(FP8_GRID, fp8, fitted)


def _grid_fit(grid: dict, rows: list[Row], held: dict) -> dict:
    keys = list(grid)
    best, best_point = math.inf, None
    for values in itertools.product(*(grid[k] for k in keys)):
        point = overrides_of(keys, values)
        merged = {hw: {**held.get(hw, {}), **point.get(hw, {})} for hw in set(held) | set(point)}
        res = errors(rows, merged)
        loss = sum(math.log(p / m) ** 2 for _, m, p, _, _ in res) / len(res)
        if loss < best:
            best, best_point = loss, merged
    print(f"fitted on {len(rows)} calibration rows (rms log error {math.sqrt(best) * 100:.1f}%):")
    for hw, names in best_point.items():
        for name, value in names.items():
            if (hw, name) in grid:
                print(f"  {hw} {name} = {value:.3f}")
    return best_point


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--fit", action="store_true", help="Grid-search the fitted constants on calibration rows.")
    parser.add_argument("--versus-planner", action="store_true", help="Also search each costed dense row's workload "
                        "and print how much faster the planner's plan is than the published layout (same model).")
    parser.add_argument("--search-time", type=float, default=20.0, help="Seconds per search with --versus-planner.")
    parser.add_argument("--ring-step-grid", action="store_true", help="Also print the calibration and validation "
                        "error over a grid of the all-gather / reduce-scatter ring step across nodes.")
    args = parser.parse_args()
    rows = load_rows()
    overrides = fit(rows) if args.fit else None
    worst = 0.0
    everything = []
    for split in SPLITS:
        results = errors([r for r in rows if r.split == split], overrides)
        everything += results
        worst = max(worst, print_table(f"{split} rows" + (" (fitted on these)" if split == "calibration" else
                                                         " (never fitted on)"), results))
    print_data_parallel_at_scale(sorted(everything, key=lambda t: [r.id for r in rows].index(t[0].id)))
    if args.ring_step_grid:
        print_ring_step_grid(rows)
    if args.versus_planner:
        print_versus_planner([r for r in rows if not r.is_moe], overrides, args.search_time)
    print_moe(rows)  # before the dense summary, which stays the last lines (what the gate reads)
    skipped = [(r, r.skip_reason()) for r in rows if not r.is_moe and r.skip_reason()]
    print(f"\nnot costed ({len(skipped)} dense rows; MoE rows above):")
    for reason in sorted({why for _, why in skipped}):
        ids = [r.id for r, why in skipped if why == reason]
        print(f"  {reason}: {', '.join(ids)}")
    print(f"\nlargest |error| over both splits: {worst * 100:.1f}% (target ≤ {args.tolerance * 100:.0f}%)")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
