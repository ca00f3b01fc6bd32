"""Flags and choices shared by the `uniap` commands, so every command spells them the same way."""

from __future__ import annotations

import json
import sys
from enum import Enum

import typer

from uniap.errors import UniapError
from uniap.spec.engine import ATTENTIONS, KERNELS
from uniap.schedules import SCHEDULES, SEARCHES
from uniap.spec.workload import DEFAULT_PRECISIONS, PRECISIONS


def choices(name: str, values) -> type[Enum]:
    """A typer choice Enum over a list of values kept elsewhere (members named by their values)."""
    return Enum(name, [(v, v) for v in values], type=str)


Fmt = choices("Fmt", ("table", "json"))
Precision = choices("Precision", PRECISIONS)
Schedule = choices("Schedule", SCHEDULES)
Search = choices("Search", SEARCHES)
Kernels = choices("Kernels", KERNELS)
AttentionKernel = choices("AttentionKernel", ATTENTIONS)


KERNELS_FLAG = typer.Option(None, "--kernels", help="fused (Megatron-style, torch.compile) or eager PyTorch "
                            "(default: the cluster's, eager for presets: what `uniap run` executes).")
ATTENTION_FLAG = typer.Option(None, "--attention", help="flash, or standard (materialised scores; default: "
                              "the cluster's: flash on A100/H100, standard where no flash kernel exists).")


def with_engine(cluster, kernels: "Kernels | None", attention: "AttentionKernel | None"):
    """`cluster` costed under the engine the flags name (`uniap.api.with_engine`)."""
    from uniap.api import with_engine as settle

    return settle(cluster, kernels.value if kernels is not None else None,
                  attention.value if attention is not None else None)


def resolve_precision(precision: "Precision | None", cluster, among: tuple[str, ...] = DEFAULT_PRECISIONS,
                      engine: str = "") -> str:
    """The flag's precision, or the one of `among` (an engine's precisions) the cluster's device computes fastest:
    the highest dense peak, bf16 before fp16 before fp32 on a tie (A100/H100: bf16; V100: fp16, or fp32 for an
    engine without fp16; TITAN Xp, whose fp16 runs at 1/64: fp32); fp8 only when asked for. Refused when the device
    has none of them, and fp8 on a device without fp8 GEMMs."""
    if precision is not None:
        chosen = Precision(precision).value
        if chosen == "fp8" and cluster.device.peak_flops.get("fp8", 0.0) <= 0:
            raise UniapError(f"{cluster.device.name} has no fp8 GEMMs: fp8 needs an H100-class device "
                             f"(h100-80g, h100-96g, h800-80g); choose bf16, fp16 or fp32")
        return chosen
    peaks = cluster.device.peak_flops
    usable = [p for p in DEFAULT_PRECISIONS if p in among and peaks.get(p, 0.0) > 0]
    if not usable:
        raise UniapError(f"{cluster.device.name} computes in none of the precisions "
                         f"{', '.join(p for p in among if p in DEFAULT_PRECISIONS)}"
                         + (f" ({engine}'s)" if engine else ""))
    return max(usable, key=lambda p: (peaks[p], DEFAULT_PRECISIONS.index(p)))  # a tie prefers the later (16-bit)


MODEL = typer.Option(..., "--model", "-m", help="Zoo name (see `uniap models`) or a Hugging Face config.json.")
CLUSTER = typer.Option(..., "--cluster", "-c", help="PRESET:NODESxDEVICES (see `uniap clusters`) or a YAML file.")
BATCH = typer.Option(..., "--global-batch", "-b", help="Samples per iteration.")
SEQ = typer.Option(None, "--seq-len", "-s", help="Sequence length (default: the model's).")
PREC = typer.Option(None, "--precision", help="fp32, mixed precision fp16/bf16, or fp8 GEMMs on H100-class devices "
                    "(default: the device's fastest of bf16, fp16, fp32).")
SCHED = typer.Option(Schedule["1f1b"], "--schedule", help="Pipeline schedule (zero-bubble: torch's "
                     "ScheduleInterleavedZeroBubble, the backward split into input and weight passes).")
FMT = typer.Option(Fmt.table, "--format", "-f", help="table for people, json for programs.")
SOLVER = typer.Option("highs", "--solver", help="MILP back-end: highs (default), scip, gurobi.")


def emit_json(obj: dict) -> None:
    """Exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
