"""Megatron-LM: a launch script, `torchrun ... pretrain_gpt.py` with the plan's flags (data, tokenizer and
optimizer flags follow as the script's arguments).

Flags and rules checked in Megatron-LM main at d98e8a6 (2026-08-22): `megatron/training/arguments.py`
(`validate_args`) and `megatron/core/transformer/transformer_block.py` (`get_num_layers_to_build`). Megatron-LM's
training code is not in the `megatron-core` wheel, so `read` checks a file against `SCHEMA`, those flags as
arguments.py declares them, and re-derives the layer split the way `get_num_layers_to_build` does:
- the data-parallel size is not a flag: world / (tp · pp), from the launch;
- `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers` set the first and last stage,
  the other stages share the rest equally; without them every stage is equal. With virtual stages
  (`--num-virtual-stages-per-pipeline-rank`, the form that works with uneven stages) a stage's chunks are equal;
- the embedding is on the first stage and the output layer on the last, besides their transformer layers;
- ZeRO-1 is `--use-distributed-optimizer`; ZeRO-2/3 would be Megatron-FSDP (`--use-megatron-fsdp`), not exported;
- pipelines run 1F1B or interleaved 1F1B (no GPipe); `--sequence-parallel` needs tp > 1;
- recomputing every block is `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`.
"""

from __future__ import annotations

import argparse
import shlex

from uniap.errors import UniapError
from uniap.export.capability import FIRST_LAST, EngineJob, EngineRules
from uniap.spec.model import ModelConfig

RULES = EngineRules(name="megatron", families=("gpt2", "llama"), precisions=("bf16", "fp16", "fp32"),
                    zero_stages=(0, 1), pipeline_zero_stages=(0, 1), tensor_parallel=True,
                    sequence_parallel_always=False, replicate_alone=False,
                    pipeline_schedules=("1f1b", "interleaved-1f1b"), split=FIRST_LAST)

SCRIPT = "pretrain_gpt.py"
RENDEZVOUS = (' --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}"'
              ' --master-port "${MASTER_PORT:-29500}"')
"""Where the nodes of a multi-node launch meet: set NODE_RANK on each node and MASTER_ADDR to node 0."""


def layer_flags(job: EngineJob) -> list[str]:
    """The pipeline split: first/last stage counts where they differ from the middle stages, virtual stages."""
    stages = job.stage_blocks
    flags = []
    if job.pp > 1 and len(set(stages)) > 1:
        middle = stages[1] if job.pp > 2 else None
        if stages[0] != middle:
            flags.append(f"--decoder-first-pipeline-num-layers {stages[0]}")
        if stages[-1] != middle:
            flags.append(f"--decoder-last-pipeline-num-layers {stages[-1]}")
    if job.virtual_stages > 1:
        flags.append(f"--num-virtual-stages-per-pipeline-rank {job.virtual_stages}")
    return flags


def model_flags(job: EngineJob, config: ModelConfig) -> list[str]:
    flags = [f"--num-layers {job.blocks}", f"--hidden-size {config.hidden}", f"--ffn-hidden-size {config.ffn}",
             f"--num-attention-heads {config.heads}", f"--seq-length {job.seq_len}",
             f"--max-position-embeddings {max(job.seq_len, config.max_seq)}"]
    if config.kv_channels:
        flags.append(f"--kv-channels {config.kv_channels}")
    if config.n_kv_heads != config.heads:
        flags += ["--group-query-attention", f"--num-query-groups {config.n_kv_heads}"]
    if config.gated_mlp:
        flags.append("--swiglu")
    if config.norm == "rmsnorm":
        flags.append("--normalization RMSNorm")
    if not config.learned_positions:
        flags.append("--position-embedding-type rope")
    if not config.bias:
        flags.append("--disable-bias-linear")
    if not config.tied_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    return flags


def write(job: EngineJob, config: ModelConfig) -> str:
    flags = model_flags(job, config) + [
        f"--tensor-model-parallel-size {job.tp}", f"--pipeline-model-parallel-size {job.pp}",
        *(["--sequence-parallel"] if job.sp else []), *layer_flags(job),
        f"--micro-batch-size {job.micro_batch_size}", f"--global-batch-size {job.global_batch}",
        *(["--use-distributed-optimizer"] if job.dp > 1 and job.zero == 1 else []),
        *(["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
          if job.recompute else []),
        *({"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(job.precision, [])),
    ]
    nodes = max(1, job.world // job.devices_per_node)
    per_node = job.world // nodes
    head = [f"#!/bin/sh",
            f"# {job.model} on {job.world} devices, from a uniap plan (Megatron-LM flags as of d98e8a6).",
            f"# data-parallel size = {job.world} / (tp {job.tp} · pp {job.pp}) = {job.dp}; "
            f"{job.micro_batches} micro-batches per iteration.",
            f"# Run from a Megatron-LM checkout on every node; add data, tokenizer and optimizer flags as arguments.",
            f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{RENDEZVOUS if nodes > 1 else ''} {SCRIPT} \\"]
    return "\n".join(head + [f"  {flag} \\" for flag in flags] + ['  "$@"']) + "\n"


def _parser() -> argparse.ArgumentParser:
    """SCHEMA: the flags `write` uses, with the types and choices of Megatron-LM's arguments.py (d98e8a6)."""
    p = argparse.ArgumentParser(prog="megatron", add_help=False, exit_on_error=False)
    for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--seq-length",
                 "--max-position-embeddings", "--kv-channels", "--num-query-groups", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
                 "--num-layers-per-virtual-pipeline-stage", "--micro-batch-size", "--global-batch-size",
                 "--recompute-num-layers"):
        p.add_argument(flag, type=int, default=1 if flag.endswith("-model-parallel-size") else None)
    for flag in ("--group-query-attention", "--swiglu", "--disable-bias-linear",
                 "--untie-embeddings-and-output-weights", "--sequence-parallel", "--use-distributed-optimizer",
                 "--bf16", "--fp16"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    p.add_argument("--position-embedding-type", choices=("learned_absolute", "rope", "mrope", "relative", "none"),
                   default="learned_absolute")
    p.add_argument("--recompute-granularity", choices=("full", "selective"))
    p.add_argument("--recompute-method", choices=("uniform", "block"))
    return p


SCHEMA = _parser()


def read(text: str) -> dict:
    """The settings a launch script carries (`EngineJob.settings`), checked as Megatron-LM's validate_args does."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    if "torchrun" not in words or SCRIPT not in words:
        raise UniapError(f"not a Megatron-LM launch (torchrun ... {SCRIPT})")
    launch = words[words.index("torchrun") + 1:words.index(SCRIPT)]
    try:
        world = int(launch[launch.index("--nnodes") + 1]) * int(launch[launch.index("--nproc-per-node") + 1])
        args, unknown = SCHEMA.parse_known_args([w for w in words[words.index(SCRIPT) + 1:] if w != "$@"])
    except (ValueError, IndexError, argparse.ArgumentError) as exc:
        raise UniapError(f"Megatron-LM flags: {exc}") from None
    if unknown:
        raise UniapError(f"Megatron-LM flags: not among the flags checked: {' '.join(unknown)}")
    needed = (("--num-layers", args.num_layers), ("--micro-batch-size", args.micro_batch_size),
              ("--global-batch-size", args.global_batch_size))
    missing = [flag for flag, value in needed if value is None]
    if missing:
        raise UniapError(f"Megatron-LM flags: {', '.join(missing)} missing")
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if world % (tp * pp):
        raise UniapError(f"Megatron-LM flags: tp·pp = {tp * pp} does not divide the world of {world}")
    dp = world // (tp * pp)
    if args.global_batch_size % (args.micro_batch_size * dp):
        raise UniapError("Megatron-LM flags: global batch is not a multiple of micro-batch size × data-parallel size")
    if args.sequence_parallel and tp == 1:
        raise UniapError("Megatron-LM flags: --sequence-parallel without tensor parallelism is switched off")
    if args.recompute_granularity == "selective" and args.recompute_method:
        raise UniapError("Megatron-LM flags: selective recompute takes no --recompute-method")
    return {"tp": tp, "dp": dp, "pp": pp, "zero": int(args.use_distributed_optimizer and dp > 1),
            "sp": args.sequence_parallel, "recompute": args.recompute_granularity == "full",
            "global_batch": args.global_batch_size,
            "micro_batches": args.global_batch_size // (args.micro_batch_size * dp),
            "micro_batch_size": args.micro_batch_size,
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            **_split(args, pp)}


def _split(args: argparse.Namespace, pp: int) -> dict:
    """Blocks per chunk as `get_num_layers_to_build` builds them, the schedule and the virtual stages."""
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    v = args.num_virtual_stages_per_pipeline_rank
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if v is not None or first is not None or last is not None:
            raise UniapError("Megatron-LM flags: --num-layers-per-virtual-pipeline-stage takes neither "
                             "--num-virtual-stages-per-pipeline-rank nor uneven first/last stages")
        v = args.num_layers // pp // args.num_layers_per_virtual_pipeline_stage
    v = v if v and pp > 1 else 1
    rest, left = args.num_layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    if (left and rest % left) or (left == 0 and rest):
        raise UniapError("Megatron-LM flags: with uneven pipelining the left over layers must be divisible by "
                         "left over stages")
    stages = [rest // left if left else 0] * pp
    if first is not None:
        stages[0] = first
    if last is not None:
        stages[-1] = last
    if any(n % v for n in stages):
        raise UniapError(f"Megatron-LM flags: layers per stage {stages} are not divisible by {v} virtual stages")
    return {"schedule": ("interleaved-1f1b" if v > 1 else "1f1b") if pp > 1 else None, "virtual_stages": v,
            "chunk_blocks": tuple(stages[j % pp] // v for j in range(pp * v))}
