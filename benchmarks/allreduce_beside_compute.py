"""How much a gloo all-reduce on some ranks slows the compute of others when ranks share cores.

The demo's chosen llama plan, two stages of dp2 with one micro-batch, runs 11–31 % slower than predicted in
every run since 4 December. The shared-core simulation that prices it (`profile.calibration.plan_scale`) counts
the ranks that compute at once; it counts a ZeRO-0 gradient all-reduce, which the runtime starts asynchronously
as a stage's backward ends, as using no core. One stage's all-reduce then runs beside the other stage's backward.

Four gloo ranks (OMP_NUM_THREADS=1 each) on this machine's cores. Ranks 0 and 1 time a forward and backward of
the whole model (local layers, the plan's 8 samples per rank), while ranks 2 and 3
  wait at a barrier (what the simulation assumes of a stage that only all-reduces),
  all-reduce a tensor the size of half the model's parameters (a pp2 stage's gradients), back to back,
  compute the same forward and backward (what the simulation assumes of a busy stage).
Rounds alternate the three; the table gives medians and the slowdown against the first.

Run: `python benchmarks/allreduce_beside_compute.py` (about 40 s).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_accuracy import GQA_LLAMA  # noqa: E402

RANKS = 4
SAMPLES = 8  # per rank: the demo's global batch of 16 over dp2, one micro-batch
SEQ = 64  # the demo's tokens per sequence
ROUNDS = 4
SECONDS = 0.5  # each rank's timing window per round and mode
MODES = ("idle", "all-reduce", "compute")


def _config(name: str):
    from uniap.demo import DEMO_MODEL
    from uniap.spec.hf import read_hf_dict

    return DEMO_MODEL if name == "demo-gpt" else read_hf_dict(GQA_LLAMA, "gqa-llama")


def _rank(rank: int, store: str, name: str, out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    others = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    from uniap.models.decoder import build_layer, lm_loss

    config = _config(name)
    chain = [build_layer(config, u, 0) for u in range(config.layers + 2)]
    grads = torch.ones(sum(p.numel() for layer in chain for p in layer.parameters()) // 2)
    tokens = torch.randint(0, config.vocab, (SAMPLES, SEQ))

    def step() -> None:
        x = tokens
        for layer in chain[:-1]:
            x = layer(x)
        lm_loss(chain[-1](x), tokens, tokens.numel()).backward()

    def all_reduces(started: float) -> float:
        """Back to back until both ranks have passed the window (a flag in the tensor agrees when to stop)."""
        count = 0
        while True:
            grads.fill_(1.0)
            grads[0] = float(time.perf_counter() - started < SECONDS * 1.1)
            dist.all_reduce(grads, group=others)
            count += 1
            if grads[0] < 2:
                return (time.perf_counter() - started) / count

    for _ in range(3):
        step()
    times: dict[str, list[float]] = {mode: [] for mode in (*MODES, "one all-reduce")}
    for _ in range(ROUNDS):
        for mode in MODES:
            dist.barrier()
            started, calls = time.perf_counter(), 0
            if rank < 2 or mode == "compute":
                while time.perf_counter() - started < SECONDS * (1.0 if rank < 2 else 1.1):
                    step()
                    calls += 1
                if rank < 2:
                    times[mode].append((time.perf_counter() - started) / calls)
            elif mode == "all-reduce":
                times["one all-reduce"].append(all_reduces(started))
            dist.barrier()
    gathered: list = [None] * RANKS
    dist.all_gather_object(gathered, times)
    if rank == 0:
        for mode in MODES:
            out[mode] = statistics.median(gathered[0][mode] + gathered[1][mode])
        out["one all-reduce"] = statistics.median(gathered[2]["one all-reduce"] + gathered[3]["one all-reduce"])
        out["elements"] = grads.numel()
    dist.destroy_process_group()


def measure(name: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), name, out), nprocs=RANKS)
        return dict(out)


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"{RANKS} gloo ranks on {os.cpu_count()} cores; ranks 0-1 compute, ranks 2-3 do what the column says")
    print(f"{'model':>10} {'others idle ms':>14} {'all-reducing ms':>15} {'computing ms':>12} "
          f"{'slowdown: all-reduce':>20} {'compute':>8} {'one all-reduce ms':>17} {'elements':>9}")
    for name in ("demo-gpt", "gqa-llama"):
        got = measure(name)
        idle = got["idle"]
        print(f"{name:>10} {idle * 1e3:>14.2f} {got['all-reduce'] * 1e3:>15.2f} {got['compute'] * 1e3:>12.2f} "
              f"{got['all-reduce'] / idle:>19.2f}× {got['compute'] / idle:>7.2f}× "
              f"{got['one all-reduce'] * 1e3:>17.2f} {got['elements']:>9d}", flush=True)


if __name__ == "__main__":
    main()
