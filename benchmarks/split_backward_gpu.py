"""What a split backward costs on a GPU: one transformer block's forward, whole backward, and the input and weight
passes torch's zero-bubble schedules run (torch.distributed.pipelining's stage_backward_input and
stage_backward_weight), timed with CUDA events; against the cost model's weight-pass share of the block.

The cost model prices a split backward at the whole backward's time, the weight pass being the weight-gradient
GEMMs' share of it (`cost.compute.weight_gradient_time`). On 2 CPU ranks the split cost 5–13 % more per step
(README, "Pipeline schedules"); this measures whether a GPU pays it too.

Run:  python benchmarks/split_backward_gpu.py [--model llama3-8b] [--seq 4096] [--micro 1] [--reps 20]
(needs CUDA; `--device cpu --model tiny-llama --seq 64` runs it small on CPU to check the script, as
tests/cost/test_split_backward_benchmark.py does)
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from uniap.models.decoder import Block
from uniap.profile.harness import Clock
from uniap.schedules import FORWARD_SHARE
from uniap.spec.zoo import ZOO


def _timer(device: torch.device):
    """A function timing a callable in seconds, with the profiler's clock (CUDA events on a GPU, else the wall
    clock)."""
    clock = Clock(device)

    def timed(fn) -> float:
        marks: list = []
        with clock.region(marks):
            fn()
        return clock.read(marks)[0]
    return timed


def measure(model: str, seq: int, micro: int, reps: int, device: torch.device, dtype: torch.dtype) -> dict:
    """Median seconds of: forward; forward + whole backward; forward + input pass + weight pass (and each pass)."""
    config = ZOO[model]
    torch.manual_seed(0)
    block = Block(config).to(device=device, dtype=dtype)
    params = list(block.parameters())
    x0 = torch.randn(micro, seq, config.hidden, device=device, dtype=dtype)
    grad = torch.randn_like(x0)
    timed = _timer(device)
    out: dict[str, list[float]] = {"forward": [], "whole": [], "input": [], "weight": []}
    for rep in range(reps + 3):  # three warm-ups
        x = x0.detach().requires_grad_(True)
        y = None

        def forward():
            nonlocal y
            y = block(x)

        t_fwd = timed(forward)
        t_whole = timed(lambda: torch.autograd.backward(y, grad))
        x = x0.detach().requires_grad_(True)
        forward()
        groups = None

        def input_pass():
            nonlocal groups
            _, groups = stage_backward_input([y], [grad], [x], iter(params))

        t_input = timed(input_pass)
        t_weight = timed(lambda: stage_backward_weight(iter(params), groups))
        block.zero_grad(set_to_none=True)
        if rep >= 3:
            for key, value in zip(out, (t_fwd, t_whole, t_input, t_weight)):
                out[key].append(value)
    return {key: statistics.median(values) for key, values in out.items()}


def predicted_share(model: str, seq: int, micro: int) -> float:
    """The cost model's weight-pass share of the block's backward (h100-80g, bf16, eager kernels, flash)."""
    from uniap.cost.tables import layer_compute, weight_gradient_seconds
    from uniap.spec import load_model
    from uniap.spec.cluster import load_cluster
    from uniap.spec.workload import Workload
    from uniap.strategies import Strategy

    spec, cluster = load_model(model, seq), load_cluster("h100-80g:1x1")
    layer = next(l for l in spec.layers if l.kind == "block")
    workload, s = Workload(micro, seq, "bf16"), Strategy(dp=1, tp=1)
    whole = layer_compute(layer, s, micro, cluster, workload)
    return weight_gradient_seconds(layer, s, micro, cluster, workload) / (whole * (1 - FORWARD_SHARE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--micro", type=int, default=1)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("split_backward_gpu: no CUDA device here (--device cpu with a small --model and --seq "
                         "checks the script)")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    t = measure(args.model, args.seq, args.micro, args.reps, device, dtype)
    split = t["input"] + t["weight"]
    print(f"one {args.model} block, micro-batch {args.micro} × {args.seq} tokens, {dtype}, {name}, torch "
          f"{torch.__version__}, median of {args.reps}:")
    print(f"  forward {t['forward'] * 1e3:.3f} ms; whole backward {t['whole'] * 1e3:.3f} ms; input pass "
          f"{t['input'] * 1e3:.3f} ms + weight pass {t['weight'] * 1e3:.3f} ms = {split * 1e3:.3f} ms")
    print(f"  split over whole backward: {split / t['whole']:.3f}; forward + split over forward + whole: "
          f"{(t['forward'] + split) / (t['forward'] + t['whole']):.3f}")
    print(f"  weight pass share of the split backward: measured {t['weight'] / split:.3f}, cost model "
          f"{predicted_share(args.model, args.seq, args.micro):.3f}")


if __name__ == "__main__":
    main()
