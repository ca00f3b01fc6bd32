"""Megatron-LM: a launch script, `torchrun ... pretrain_gpt.py` with the plan's flags (data, tokenizer and
optimizer flags follow as the script's arguments).

Flags and rules checked in Megatron-LM main at d98e8a6 (2026-08-22): `megatron/training/arguments.py`
(`validate_args`) and `megatron/core/transformer/transformer_block.py` (`get_num_layers_to_build`). Megatron-LM's
training code is not in the `megatron-core` wheel, so tests/export/engine_readers.py checks a file against a schema
of those flags as arguments.py declares them, and re-derives the layer split the way `get_num_layers_to_build`
does:
- the data-parallel size is not a flag: world / (tp · pp), from the launch;
- `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers` set the first and last stage,
  the other stages share the rest equally; without them every stage is equal. With virtual stages
  (`--num-virtual-stages-per-pipeline-rank`, the form that works with uneven stages) a stage's chunks are equal;
- the embedding is on the first stage and the output layer on the last, besides their transformer layers;
- ZeRO-1 is `--use-distributed-optimizer`; ZeRO-2/3 would be Megatron-FSDP (`--use-megatron-fsdp`), not exported;
- pipelines run 1F1B or interleaved 1F1B (no GPipe); `--sequence-parallel` needs tp > 1;
- recomputing every block is `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`;
- RoPE rotates with `--rotary-base` (an int, default 10000) and Llama 3.1's scaling with `--use-rope-scaling`
  (factor `--rope-scaling-factor`, default 8);
- with tp > 1 `validate_args` asserts CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell (device arch < 10; it
  only warns with Megatron-FSDP, not exported), so the script sets it.
"""

from __future__ import annotations

from uniap.export.capability import FIRST_LAST, EngineJob, EngineRules, block_layout_why_not, rope_of
from uniap.spec.model import ModelConfig

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


def architecture_why_not(config: ModelConfig) -> str | None:
    """What of the model Megatron-LM's GPT model (megatron/core/transformer) cannot build as `model_flags` sets it."""
    biases = (config.qkv_bias, config.out_bias, config.mlp_bias)
    if biases not in ((True, True, True), (False, False, False), (True, False, False)):
        named = ", ".join(f"{part} {'on' if on else 'off'}" for part, on in zip(("q/k/v", "output", "MLP"), biases))
        return f"its linear layers have biases on all, none or only the q/k/v projections (the model has {named})"
    if config.norm == "layernorm" and not config.norm_bias:
        return "its LayerNorm always has a bias (the model's has none)"
    if config.qk_norm not in ("", "head"):
        return f"its q/k norm is one head_dim-wide norm shared by the heads (the model has {config.qk_norm!r})"
    if config.gated_mlp and config.activation != "silu":
        return f"its gated MLP is SwiGLU (the model gates with {config.activation})"
    if not config.gated_mlp and config.activation not in ("gelu", "gelu_tanh"):
        return f"its plain MLP is GeLU (the model's is {config.activation})"
    return block_layout_why_not(config)


RULES = EngineRules(name="megatron", families=("gpt2", "llama"), precisions=("bf16", "fp16", "fp32"),
                    zero_stages=(0, 1), pipeline_zero_stages=(0, 1), tensor_parallel=True,
                    sequence_parallel_always=False, replicate_alone=False,
                    pipeline_schedules=("1f1b", "interleaved-1f1b"), split=FIRST_LAST,
                    architecture_why_not=architecture_why_not)


def model_flags(job: EngineJob) -> list[str]:
    """The architecture as arguments.py (d98e8a6) spells it; `architecture_why_not` refuses what it cannot.
    A plain MLP is Megatron's F.gelu: GPT-2's tanh approximation differs from it by under 1e-3 and has the same
    shapes and cost (`--openai-gelu` is declared there but not wired to the MLP)."""
    config = job.config
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
    if config.qk_norm:
        flags.append("--qk-layernorm")
    if not config.learned_positions:
        flags.append("--position-embedding-type rope")
        if config.rotary_fraction != 1.0:
            flags.append(f"--rotary-percent {config.rotary_fraction}")
        rope = rope_of(job)
        if rope:
            flags.append(f"--rotary-base {rope.base}")
            if rope.llama3_scaling:
                flags.append("--use-rope-scaling")
    if not (config.qkv_bias and config.out_bias and config.mlp_bias):
        flags.append("--disable-bias-linear")
        if config.qkv_bias:
            flags.append("--add-qkv-bias")
    if not config.tied_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    if not config.dropout:  # Megatron's hidden_dropout and attention_dropout default to 0.1
        flags += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    return flags


def write(job: EngineJob) -> str:
    flags = model_flags(job) + [
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
    head = ["#!/bin/sh",
            f"# {job.model} on {job.world} devices, from a uniap plan (Megatron-LM flags as of d98e8a6).",
            f"# data-parallel size = {job.world} / (tp {job.tp} · pp {job.pp}) = {job.dp}; "
            f"{job.micro_batches} micro-batches per iteration.",
            "# Run from a Megatron-LM checkout on every node; add data, tokenizer and optimizer flags as arguments."]
    if not job.config.learned_positions and rope_of(job) is None:
        head += ["# The plan does not record this model's rope_theta or rope_scaling: Megatron-LM rotates with base",
                 "# 10000 unless given --rotary-base THETA (and --use-rope-scaling for rope_scaling of type llama3)."]
    if job.tp > 1:
        head += ["# validate_args requires this with tensor parallelism on GPUs before Blackwell:",
                 "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    head.append(f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{RENDEZVOUS if nodes > 1 else ''} {SCRIPT} \\")
    return "\n".join(head + [f"  {flag} \\" for flag in flags] + ['  "$@"']) + "\n"
