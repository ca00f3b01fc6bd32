"""Runtime overhead: `uniap run` of a uniform dp plan against plain torch on the same model, data and loop.

    python benchmarks/runtime_overhead.py [--pairs 16] [--steps 4] [--nproc 4]

ZeRO-0: our plan (dp4, ZeRO-0) against `DistributedDataParallel`; ZeRO-3: our plan (dp4, ZeRO-3) against FSDP2
`fully_shard` per block plus the root (torch's recipe). Both sides build the same model (`build_model`, same
seed), train on the same batches (`runtime.data.batch`, each rank its rows) with the same optimizer
(`make_optimizer`: SGD momentum, single-tensor kernels) and time a step the same way: from a world barrier to
the end of the optimizer step, slowest rank, the first step of each run untimed. gloo has no averaging reduce op,
so the FSDP2 side sums with `set_force_sum_reduction_for_comms(True)` as ours does.

Per ZeRO level one torchrun launch alternates the two sides in one process group (ours `steps` steps, plain
`steps` steps, ours, ...), so that a slow spell of the machine touches both. Per pair, ratio = ours' median
step / plain's; the table gives the median and quartiles of the ratios (the quartiles say how quiet the machine
was) and the ratio of each side's fastest step (noise from other jobs only ever adds time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

WARMUP = 1  # ours does the same: its first step is untimed (and the one that meters memory)
GLOBAL_BATCH, SEQ_LEN = 16, 64


def model_config():
    from uniap.spec.zoo import ZOO

    return replace(ZOO["tiny-gpt"], name="overhead-gpt", hidden=256, ffn=1024, layers=4)


def plain_steps(zero: int, steps: int, ctx) -> list[float]:
    """Plain torch on this rank: DDP (ZeRO-0) or FSDP2 per block + root (ZeRO-3); per-step times (slowest rank)."""
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    from uniap.models.decoder import build_model, lm_loss
    from uniap.runtime import data as data_mod
    from uniap.runtime.train import make_optimizer

    config = model_config()
    model = build_model(config, 0).to(ctx.device)
    if zero == 0:
        model = DistributedDataParallel(model)
    else:
        for block in model.blocks.values():
            fully_shard(block).set_force_sum_reduction_for_comms(True)
        fully_shard(model).set_force_sum_reduction_for_comms(True)
    optimizer = make_optimizer(model.parameters(), 1e-3, "sgd")
    rows = GLOBAL_BATCH // ctx.world
    times = []
    for step in range(steps):
        x, y = data_mod.batch(step, GLOBAL_BATCH, SEQ_LEN, config.vocab, 0)
        x = x[ctx.rank * rows:(ctx.rank + 1) * rows].to(ctx.device)
        y = y[ctx.rank * rows:(ctx.rank + 1) * rows].to(ctx.device)
        dist.barrier()
        t0 = time.perf_counter()
        loss = lm_loss(model(x), y)
        loss.backward()
        float(loss.detach().item())
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed.item()))
    return times


def rank_body(payload: dict, out: Path) -> list:
    """torchrun entry: alternate ours and plain torch `pairs` times in one process group; rank 0 returns
    [(ours' step times, plain step times), ...] without the warm-up steps."""
    from uniap.runtime.job import TrainingJob
    from uniap.runtime.train import train_job
    from uniap.runtime.worker import init_distributed

    ctx = init_distributed(120.0)
    steps, pairs = payload["steps"], []
    for _ in range(payload["pairs"]):
        result = train_job(TrainingJob(payload["plan"], steps=steps), ctx)
        plain = plain_steps(payload["zero"], steps, ctx)
        if ctx.rank == 0:
            pairs.append((result["step_times_s"][WARMUP:], plain[WARMUP:]))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    from uniap.runtime.launcher import Nodes, launch
    from uniap.runtime.plans import uniform_plan

    config = model_config()
    folder = Path(tempfile.mkdtemp(prefix="uniap-overhead-"))
    rows = []
    for zero, baseline in ((0, "DDP"), (3, "FSDP2 fully_shard")):
        plan = uniform_plan(config, args.nproc, dp=args.nproc, zero=zero, global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN)
        path = folder / f"dp{args.nproc}-zero{zero}.json"
        plan.save(path)
        pairs = launch([__file__, "--rank"], {"plan": str(path), "zero": zero, "steps": args.steps,
                                              "pairs": args.pairs}, Nodes(args.nproc), wall_s=1800.0,
                       what="overhead benchmark")
        rows.append((zero, baseline, pairs))
    print(f"\n{config.layers}-block GPT, hidden {config.hidden}, batch {GLOBAL_BATCH}, seq {SEQ_LEN}, "
          f"dp{args.nproc} on {args.nproc} local ranks; {args.pairs} alternated pairs of {args.steps} steps "
          f"(first {WARMUP} of each untimed)\n")
    print("| ZeRO | plain torch | ours ms/step | plain ms/step | ratio: median | ratio: quartiles of the pairs | "
          "ratio of fastest steps |")
    print("|---:|---|---:|---:|---:|---|---:|")
    for zero, baseline, pairs in rows:
        ours_all = [t for a, _ in pairs for t in a]
        plain_all = [t for _, b in pairs for t in b]
        ratios = [statistics.median(a) / statistics.median(b) for a, b in pairs]
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        print(f"| {zero} | {baseline} | {statistics.median(ours_all) * 1e3:.1f} | "
              f"{statistics.median(plain_all) * 1e3:.1f} | {statistics.median(ratios):.3f} | "
              f"{low:.2f} – {high:.2f} | {min(ours_all) / min(plain_all):.3f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        from uniap.runtime.launcher import rank_main

        rank_main(rank_body, "runtime_overhead.py --rank PAYLOAD.json OUT_DIR", sys.argv[2:])
    else:
        main()
