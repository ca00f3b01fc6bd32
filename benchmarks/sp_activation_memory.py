"""Activation bytes per layer under tensor parallelism, with and without sequence parallelism: what the runtime
keeps for backward against what the cost model charges.

    python benchmarks/sp_activation_memory.py [--json]

tiny-gpt and tiny-llama (sequence 64, micro-batch 2, fp32) on 2 local gloo ranks. Each layer kind (a block; the
head with its loss) is built and laid out as the runtime builds it (`apply_strategy`: tp2, then tp2·sp), gets its
input in the layout the runtime gives it (`relayout`: the whole sequence, or under sp the rank's slice), and one
forward is metered with the runtime's own `ActivationMeter` (bytes autograd keeps for backward, by storage,
parameters excluded; what `uniap run` reports on CPU). Per sample, next to `cost.memory.activation_bytes_per_sample`
(flash attention: CPU SDPA keeps no score matrix either) for the config as the decoder trains it (`as_trained`: no
dropout), and for the config as given (GPT-2's family default trains with dropout: its masks are charged). The
last lines give what sequence parallelism saves on a block, measured over charged.
"""

from __future__ import annotations

import argparse
import json
import sys

FAMILIES = ("tiny-gpt", "tiny-llama")
TP, MICRO_BATCH, SEQ_LEN, SEED = 2, 2, 64, 0
KINDS = ("block", "head")


def rank_body(payload: dict, out) -> list[dict] | None:
    """torchrun entry: rank 0 returns one row per (model, layer kind, sp)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from uniap.cost.memory import activation_bytes_per_sample
    from uniap.models.decoder import as_trained, build_layer, lm_loss
    from uniap.runtime.measure import ActivationMeter
    from uniap.runtime.parallelize import apply_strategy
    from uniap.runtime.relayout import Layout, relayout
    from uniap.runtime.worker import init_distributed
    from uniap.spec.families import build_layers
    from uniap.spec.zoo import ZOO
    from uniap.strategies import Strategy

    ctx = init_distributed(120.0)
    mesh = DeviceMesh("cpu", torch.arange(TP).reshape(1, TP), mesh_dim_names=("dp", "tp"))
    group = dist.new_group(list(range(TP)))
    rows = []
    for name in payload["models"]:
        given = ZOO[name]
        trained = as_trained(given)
        for kind in KINDS:
            index = 1 if kind == "block" else given.layers + 1
            for sp in (False, True):
                strategy = Strategy(1, TP, sp=sp)
                layer = apply_strategy(build_layer(trained, index, SEED), strategy, mesh)
                gen = torch.Generator().manual_seed(SEED)
                x = torch.randn(MICRO_BATCH, SEQ_LEN, given.hidden, generator=gen, requires_grad=True)
                targets = torch.randint(0, given.vocab, (MICRO_BATCH, SEQ_LEN), generator=gen)
                x_in = relayout(x, Layout(1, TP), Layout(1, TP, seq=sp), ctx.rank, group, TP)
                meter = ActivationMeter(layer)
                with meter.forward(0):
                    y = layer(x_in)
                    if kind == "head":
                        y = lm_loss(y, targets)
                y.sum().backward()  # the saved tensors are used: a wrong layout fails here, not silently

                def charged(config):
                    spec = build_layers(config, SEQ_LEN).layers[index]
                    return activation_bytes_per_sample(spec, strategy, "fp32", flash_attention=True)

                rows.append({"model": name, "layer": kind, "sp": sp, "measured": meter.peak / MICRO_BATCH,
                             "charged": charged(trained), "charged_as_given": charged(given)})
    return rows if ctx.rank == 0 else None


def measure(models=FAMILIES) -> list[dict]:
    """One 2-rank launch; rows of bytes per sample (see the module docstring)."""
    from uniap.runtime.launcher import Nodes, launch

    return launch([__file__, "--rank"], {"models": list(models)}, Nodes(TP), wall_s=300.0, what="sp memory benchmark")


def savings(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per model: what sp saves on a block per sample, measured and charged (as trained, as given)."""
    out = {}
    for name in dict.fromkeys(r["model"] for r in rows):
        tp, sp = (next(r for r in rows if r["model"] == name and r["layer"] == "block" and r["sp"] is on)
                  for on in (False, True))
        out[name] = {key: tp[key] - sp[key] for key in ("measured", "charged", "charged_as_given")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows and savings as JSON")
    args = parser.parse_args()
    rows = measure()
    if args.json:
        print(json.dumps({"rows": rows, "savings": savings(rows)}))
        return
    print(f"\nbytes kept for backward per sample, fp32, sequence {SEQ_LEN}, micro-batch {MICRO_BATCH}, tp{TP}\n")
    print("| model | layer | strategy | measured | charged (as trained) | measured / charged | "
          "charged (config as given) |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['layer']} | tp{TP}{'·sp' if r['sp'] else ''} | {r['measured']:,.0f} | "
              f"{r['charged']:,.0f} | {r['measured'] / r['charged']:.3f} | {r['charged_as_given']:,.0f} |")
    print()
    for name, s in savings(rows).items():
        print(f"{name}: sp saves {s['measured']:,.0f} B/sample per block; measured / charged = "
              f"{s['measured'] / s['charged']:.2f} (as trained), {s['measured'] / s['charged_as_given']:.2f} "
              "(config as given)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        from uniap.runtime.launcher import rank_main

        rank_main(rank_body, "sp_activation_memory.py --rank PAYLOAD.json OUT_DIR", sys.argv[2:])
    else:
        main()
