"""Runtime overhead: `uniap run` of a uniform dp plan against plain torch on the same model, data and loop.

    python benchmarks/runtime_overhead.py [--steps 40] [--nproc 4]

ZeRO-0: our plan (dp4, ZeRO-0) against `DistributedDataParallel`; ZeRO-3: our plan (dp4, ZeRO-3) against FSDP2
`fully_shard` per block plus the root (torch's recipe). Both sides build the same model (`build_model`, same
seed), train on the same batches (`runtime.data.batch`, each rank its rows) with the same optimizer
(`make_optimizer`: SGD momentum, single-tensor kernels) and time a step the same way: from a world barrier to
the end of the optimizer step, slowest rank, the first WARMUP steps untimed. gloo has no averaging reduce op,
so the FSDP2 side sums with `set_force_sum_reduction_for_comms(True)` as ours does.

Per ZeRO level one torchrun launch alternates the two sides step by step in one process group (our run of the
plan calls a plain-torch step after each of its own, outside its timing), so that a slow spell of the machine
touches both. Per pair of steps, ratio = ours / plain; the table gives the median and quartiles of the ratios
(the quartiles say how quiet the machine was) and the ratio of each side's fastest step (noise from other jobs
only ever adds time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

WARMUP = 2  # ours' first step meters memory and is never timed; one more for the allocator to settle
GLOBAL_BATCH, SEQ_LEN = 16, 64


def model_config():
    from uniap.spec.zoo import ZOO

    return replace(ZOO["tiny-gpt"], name="overhead-gpt", hidden=256, ffn=1024, layers=4)


def plain_trainer(zero: int, ctx):
    """Plain torch on this rank: DDP (ZeRO-0) or FSDP2 per block + root (ZeRO-3); returns step(step) -> the
    step's time (slowest rank)."""
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

    def step(index: int) -> float:
        x, y = data_mod.batch(index, GLOBAL_BATCH, SEQ_LEN, config.vocab, 0)
        x = x[ctx.rank * rows:(ctx.rank + 1) * rows].to(ctx.device)
        y = y[ctx.rank * rows:(ctx.rank + 1) * rows].to(ctx.device)
        dist.barrier()
        t0 = time.perf_counter()
        loss = lm_loss(model(x), y)
        loss.backward()
        float(loss.detach().item())
        optimizer.step()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=ctx.device)
        optimizer.zero_grad(set_to_none=True)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed.item())

    return step


def rank_body(payload: dict, out: Path) -> list:
    """torchrun entry: our run of the plan with a plain-torch step after each of ours, in one process group;
    rank 0 returns [(ours, plain) seconds per step]."""
    from uniap.runtime.job import TrainingJob
    from uniap.runtime.train import train_job
    from uniap.runtime.worker import init_distributed

    ctx = init_distributed(120.0)
    plain_step = plain_trainer(payload["zero"], ctx)
    plain = []
    result = train_job(TrainingJob(payload["plan"], steps=payload["steps"]), ctx,
                       after_step=lambda step: plain.append(plain_step(step)))
    return list(zip(result["step_times_s"], plain)) if ctx.rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
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
        pairs = launch([__file__, "--rank"], {"plan": str(path), "zero": zero, "steps": args.steps},
                       Nodes(args.nproc), wall_s=1800.0, what="overhead benchmark")
        rows.append((zero, baseline, pairs[WARMUP:]))
    print(f"\n{config.layers}-block GPT, hidden {config.hidden}, batch {GLOBAL_BATCH}, seq {SEQ_LEN}, "
          f"dp{args.nproc} on {args.nproc} local ranks; {args.steps} alternated steps per side, the first "
          f"{WARMUP} untimed\n")
    print("| ZeRO | plain torch | ours ms/step | plain ms/step | ratio: median | ratio: quartiles | "
          "ratio of fastest steps |")
    print("|---:|---|---:|---:|---:|---|---:|")
    for zero, baseline, pairs in rows:
        ours_t, plain_t = [a for a, _ in pairs], [b for _, b in pairs]
        ratios = [a / b for a, b in pairs]
        low, _, high = statistics.quantiles(ratios, n=4)
        print(f"| {zero} | {baseline} | {statistics.median(ours_t) * 1e3:.1f} | "
              f"{statistics.median(plain_t) * 1e3:.1f} | {statistics.median(ratios):.3f} | "
              f"{low:.2f} – {high:.2f} | {min(ours_t) / min(plain_t):.3f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        from uniap.runtime.launcher import rank_main

        rank_main(rank_body, "runtime_overhead.py --rank PAYLOAD.json OUT_DIR", sys.argv[2:])
    else:
        main()
