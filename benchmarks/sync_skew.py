"""What a collective costs right after compute when ranks share cores: the skew the demo's profile does not see.

Four gloo ranks on this machine's cores (OMP_NUM_THREADS=1 each). For compute segments of three lengths, compare
  compute alone  +  4 × all-gather back to back (how the profile times collectives)
with 4 × (a quarter of the compute, then an all-gather) (how a step interleaves them: every collective waits for
the slowest rank). The excess per collective is the skew the cost model leaves out.

Run: `python benchmarks/sync_skew.py` (about 30 s).
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RANKS = 4
GATHER_ELEMS = 64 * 256 * 4  # one rank's block of a 16-sample, 64-token, hidden-256 activation (fp32: 256 KB)


def _timed(fn, reps: int = 30) -> float:
    """Median over repetitions (each after a barrier) of the slowest rank's wall time."""
    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    out = torch.tensor([statistics.median(times)])
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out.item())


def _rank(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=RANKS)
    a, b = torch.randn(256, 256), torch.randn(1024, 256)
    block = torch.randn(GATHER_ELEMS)
    full = torch.empty(GATHER_ELEMS * RANKS)

    def compute(matmuls: int) -> None:
        for _ in range(matmuls):
            torch.mm(b, a)

    def gathers() -> None:
        for _ in range(4):
            dist.all_gather_into_tensor(full, block)

    def interleaved(matmuls: int) -> None:
        for _ in range(4):
            compute(matmuls // 4)
            dist.all_gather_into_tensor(full, block)

    if rank == 0:
        print(f"{'compute ms':>10} {'per segment':>11} {'4 gathers ms':>12} {'interleaved ms':>14} "
              f"{'excess per gather ms':>20}", flush=True)
    for matmuls in (8, 32, 128):
        alone = _timed(lambda: compute(matmuls))
        gather = _timed(gathers)
        mixed = _timed(lambda: interleaved(matmuls))
        if rank == 0:
            print(f"{alone * 1e3:>10.1f} {alone / 4 * 1e3:>11.1f} {gather * 1e3:>12.1f} {mixed * 1e3:>14.1f} "
                  f"{(mixed - alone - gather) / 4 * 1e3:>20.2f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    print(f"{RANKS} gloo ranks on {os.cpu_count()} cores")
    mp.spawn(_rank, args=(29500 + os.getpid() % 1000,), nprocs=RANKS)


if __name__ == "__main__":
    main()
