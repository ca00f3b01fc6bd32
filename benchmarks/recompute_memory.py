"""Activation memory and step time of the three recompute levels, measured on CPU next to the cost model.

    python benchmarks/recompute_memory.py [--json] [--steps 10]

tiny-llama (4 blocks, hidden 128, 4 heads) at sequence 256, micro-batch 4, fp32, in this one process (recompute
is a per-layer matter: more ranks would change nothing it does). Every block gets the level (none, selective:
the attention core under activation checkpointing, full: the whole block), the embedding and head none, as the
planner gives them; each layer is laid out by the runtime's `apply_strategy` with the attention kernel the CPU
cluster preset is costed with (standard: SDPA's math path, which keeps softmax(QKᵀ)), and then with flash (SDPA's
fused CPU kernel, which keeps no score matrix, so that selective recompute has nothing to drop).

measured: the bytes autograd keeps for one micro-batch's forward (the runtime's `ActivationMeter`, what `uniap
run` reports on CPU); model: `cost.memory.activation_bytes_per_sample` summed over the chain × micro-batch, and
`cost.compute.layer_time` summed over it on the analytic `cpu` preset (eager kernels, that attention); step:
the median of `--steps` timed forward+backward passes (the levels interleaved step by step, so a slow spell of the
machine touches all of them), after the metered one. The last columns give what a level saves against none: the
model charges the head's logits once more than an fp32 run keeps them (its 16-bit figures, which count the fp32
upcast of the logits, doubled), which the totals carry and the savings do not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

# selective-op is left out: selective checkpointing keeps its tensors in its own cache, which the saved-tensor
# meter (runtime/measure.py) does not see
LEVELS = ("none", "selective", "full")
KERNELS = ("standard", "flash")
MODEL, SEQ_LEN, MICRO_BATCH, SEED = "tiny-llama", 256, 4, 0


def _build(config, level: str, kernel: str):
    from uniap.models.decoder import build_model, use_attention_kernel
    from uniap.runtime.parallelize import apply_strategy
    from uniap.strategies import Strategy

    model = build_model(config, SEED)
    use_attention_kernel(model, kernel)
    strategies = {}
    for index, layer in model.chain():
        strategies[index] = Strategy(1, 1, recompute=level if 1 <= index <= config.layers else "none")
        apply_strategy(layer, strategies[index], None)
    return model, strategies


def measure(model: str = MODEL, seq_len: int = SEQ_LEN, micro_batch: int = MICRO_BATCH, steps: int = 10,
            kernels=KERNELS) -> list[dict]:
    """One row per (kernel, level): measured and modelled activation bytes, median step time."""
    from uniap.cost.compute import layer_time
    from uniap.cost.memory import activation_bytes_per_sample
    from uniap.models.decoder import as_trained, lm_loss
    from uniap.runtime.data import batch
    from uniap.runtime.measure import ActivationMeter
    from uniap.spec.cluster import load_cluster
    from uniap.spec.engine import Engine
    from uniap.spec.families import build_layers
    from uniap.spec.zoo import ZOO

    config = as_trained(ZOO[model])
    cpu = load_cluster("cpu:1x1")
    specs = build_layers(config, seq_len).layers
    x, y = batch(0, micro_batch, seq_len, config.vocab, SEED)
    rows = []
    for kernel in kernels:
        built = {level: _build(config, level, kernel) for level in LEVELS}
        times: dict[str, list[float]] = {level: [] for level in LEVELS}
        for level, (net, strategies) in built.items():
            meter = ActivationMeter(net)
            with meter.forward(0):
                loss = lm_loss(net(x), y)
            loss.backward()  # the saved tensors are used: a wrong recompute fails here
            modelled = micro_batch * sum(activation_bytes_per_sample(specs[i], s, "fp32", kernel == "flash")
                                         for i, s in strategies.items())
            engine = Engine("eager", kernel)
            model_s = sum(layer_time(cpu.device, engine, cpu.peak("fp32"), specs[i], micro_batch, 1, False,
                                     s.recompute, act_scale=2.0) for i, s in strategies.items())
            rows.append({"kernel": kernel, "level": level, "measured": meter.peak, "model": modelled,
                         "model_step_s": model_s})
        for _ in range(steps):
            for level, (net, _) in built.items():
                t0 = time.perf_counter()
                lm_loss(net(x), y).backward()
                times[level].append(time.perf_counter() - t0)
        for row in rows[-len(LEVELS):]:
            row["step_s"] = statistics.median(times[row["level"]]) if steps else None
    return rows


def savings(rows: list[dict]) -> list[dict]:
    """Per kernel and level: the bytes kept less than without recompute, measured and modelled."""
    none = {r["kernel"]: r for r in rows if r["level"] == "none"}
    return [{"kernel": r["kernel"], "level": r["level"], "measured": none[r["kernel"]]["measured"] - r["measured"],
             "model": none[r["kernel"]]["model"] - r["model"]} for r in rows if r["level"] != "none"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--steps", type=int, default=10, help="timed forward+backward passes per level")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    rows = measure(steps=args.steps)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"\n{MODEL}, sequence {SEQ_LEN}, micro-batch {MICRO_BATCH}, fp32, one CPU thread: activation bytes of one "
          f"micro-batch and forward+backward time\n")
    saved = {(s["kernel"], s["level"]): s for s in savings(rows)}
    print("| attention | recompute | measured bytes | model's bytes | measured / model | saved vs none, measured | "
          "saved vs none, model | step (ms) | model's step (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s = saved.get((r["kernel"], r["level"]), {"measured": 0, "model": 0})
        print(f"| {r['kernel']} | {r['level']} | {r['measured']:,.0f} | {r['model']:,.0f} | "
              f"{r['measured'] / r['model']:.3f} | {s['measured']:,.0f} | {s['model']:,.0f} | "
              f"{1e3 * r['step_s']:.1f} | {1e3 * r['model_step_s']:.1f} |")


if __name__ == "__main__":
    main()
