"""Megatron-LM: a launch script, `torchrun ... pretrain_gpt.py` with the plan's flags (data, tokenizer and
optimizer flags follow as the script's arguments).

Flags and rules checked in Megatron-LM main at d98e8a6 (2026-08-22): `megatron/training/arguments.py`
(`validate_args`) and `megatron/core/transformer/transformer_block.py` (`get_num_layers_to_build`). Megatron-LM's
training code is not in the `megatron-core` wheel, so tests/export/engine_readers.py checks a file against a schema
of those flags as arguments.py declares them, and re-derives the layer split the way `get_num_layers_to_build`
does:
- the data-parallel size is not a flag: world / (tp · cp · pp), from the launch (`validate_args`'
  total_model_size, `data_parallel_size = world_size // total_model_size`);
- `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers` set the first and last stage,
  the other stages share the rest equally; without them every stage is equal. With virtual stages
  (`--num-virtual-stages-per-pipeline-rank`, the form that works with uneven stages) a stage's chunks are equal;
- the embedding is on the first stage and the output layer on the last, besides their transformer layers;
- ZeRO-1 is `--use-distributed-optimizer`; ZeRO-2/3 would be Megatron-FSDP (`--use-megatron-fsdp`), not exported;
- pipelines run 1F1B or interleaved 1F1B (no GPipe); `--sequence-parallel` needs tp > 1;
- recomputing every block is `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`;
  selective recomputation is `--recompute-granularity selective` alone (`validate_args` asserts no
  `--recompute-method` with it, TransformerConfig no `--recompute-num-layers`); its `--recompute-modules` default
  ["core_attn"] is the attention core the plan recomputes (core/transformer/transformer_config.py);
- context parallelism is `--context-parallel-size` cp (ModelParallelConfig `context_parallel_size`; the default
  `--cp-comm-type p2p` passes keys and values around the cp ring). `validate_args` asserts that the sequence is a
  multiple of 2 · cp (its load-balanced halves) and that CUDA_DEVICE_MAX_CONNECTIONS=1 with cp > 1 as with tp > 1
  before Blackwell; the rank order is tp, cp, dp (`parallel_state`, order "tp-cp-ep-dp-pp"), ours; gradients
  are reduced and the distributed optimizer shards over dp · cp, as the plan's ZeRO does;
- fp8 is `--bf16 --fp8-format hybrid` (TransformerConfig `fp8`, e4m3 forward and e5m2 gradients) through
  Transformer Engine (`--transformer-impl transformer_engine`, the default) in the transformer layers only (the
  output layer stays bf16: `fp8_output_proj` is for mxfp8 only), with the recipe's defaults spelled as
  examples/llama/train_llama3_8b_h100_fp8.sh gives them: delayed scaling (`--fp8-recipe delayed`, the default)
  over `--fp8-amax-history-len 1024` with `--fp8-amax-compute-algo max` (TransformerConfig's defaults are 1 and
  most_recent). Parameters stay bf16 (no `--fp8-param-gather`), as the plan prices them;
- RoPE rotates with `--rotary-base` (an int, default 10000) and Llama 3.1's scaling with `--use-rope-scaling`
  (factor `--rope-scaling-factor`, default 8);
- with tp > 1 or cp > 1 `validate_args` asserts CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell (device arch
  < 10; it only warns with Megatron-FSDP, not exported), so the script sets it;
- a mixture of experts (`--num-experts`, `--moe-router-topk`, `--moe-ffn-hidden-size`,
  `--moe-shared-expert-intermediate-size`, `--moe-layer-freq` for a dense/MoE pattern; the TransformerConfig
  fields arguments.py turns into flags) lays its experts out by "parallel folding": `--expert-model-parallel-size`
  ep and `--expert-tensor-parallel-size` etp (default: tp, so always written) for every MoE layer, the expert
  ranks etp innermost, then ep, then expert-data-parallel (`parallel_state.initialize_model_parallel`, which
  raises unless etp · ep · pp divides the world: ep · etp divides a stage's dp · tp); `validate_args` asserts
  that ep divides the experts, and `MoELayer.forward` (core/transformer/moe/moe_layer.py) raises when training
  with tp > 1 without `--sequence-parallel`. Dispatch is the all-to-all the plan prices
  (`--moe-token-dispatcher-type alltoall`; the default gathers all tokens), local experts run as grouped GEMMs
  (`--moe-grouped-gemm`);
- multi-head latent attention is `--multi-latent-attention` with its ranks and head widths (`--q-lora-rank`
  unset: a full-rank query).
"""

from __future__ import annotations

from uniap.schedules import exported_schedules
from uniap.export.capability import FIRST_LAST, EngineJob, EngineRules, block_layout_why_not, moe_blocks, rope_of
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy

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
    if config.is_moe and (config.mlp_bias or config.router_bias or config.expert_bias):
        return "its export has no MLP, router or expert biases in a mixture of experts (the model has them)"
    if config.mtp_layers:
        return f"its export has no multi-token prediction (the model has {config.mtp_layers} MTP modules)"
    return block_layout_why_not(config)


def expert_layout_why_not(s: Strategy) -> str | None:
    """`MoELayer.forward` raises when training with tp > 1 without sequence parallelism; any ep · etp dividing
    dp · tp folds (`Strategy` holds that)."""
    if s.tp > 1 and not s.sp:
        return f"its MoE layers with tensor parallelism need sequence parallelism (the plan has {s.label()})"
    return None


MOE_FAMILIES = ("mixtral", "deepseek_v3")
"""Hugging Face MoE families whose blocks Megatron-LM's GPT model builds from the flags `model_flags` writes: Mixtral
is a llama whose MLPs are experts, DeepSeek-V3 adds the MLA flags. (Qwen's MoE families stay out with their dense
families.) `architecture_why_not` still refuses what a given config needs beyond them."""

def sequence_divisor(s: Strategy) -> int:
    """`validate_args`: "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1"."""
    return 2 * s.cp if s.cp > 1 else 1


RULES = EngineRules(name="megatron", families=("gpt2", "llama") + MOE_FAMILIES,
                    precisions=("bf16", "fp16", "fp32", "fp8"), recompute_levels=("none", "selective", "full"),
                    context_parallel=True, zero_stages=(0, 1), pipeline_zero_stages=(0, 1), tensor_parallel=True,
                    sequence_parallel_always=False, replicate_alone=False,
                    pipeline_schedules=tuple(exported_schedules("megatron")), split=FIRST_LAST,
                    architecture_why_not=architecture_why_not, expert_layout_why_not=expert_layout_why_not,
                    sequence_divisor=sequence_divisor,
                    absent={"selective-op": "its selective recompute recomputes modules (--recompute-modules: the "
                                            "attention core by default), not torchtitan's per-op policy (plan with "
                                            "selective)"})

RECOMPUTE_FLAGS = {"none": [], "selective": ["--recompute-granularity selective"],
                   "full": ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]}
PRECISION_FLAGS = {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp32": [],
                   "fp8": ["--bf16", "--fp8-format hybrid", "--fp8-amax-history-len 1024",
                           "--fp8-amax-compute-algo max"]}


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
    if config.kv_lora_rank:
        flags += ["--multi-latent-attention", f"--kv-lora-rank {config.kv_lora_rank}",
                  f"--qk-head-dim {config.qk_nope_dim}", f"--qk-pos-emb-head-dim {config.qk_rope_dim}",
                  f"--v-head-dim {config.v_head_dim or config.head_dim}"]
        if config.q_lora_rank:
            flags.append(f"--q-lora-rank {config.q_lora_rank}")
    return flags


def expert_flags(job: EngineJob) -> list[str]:
    """The mixture of experts and its layout (none for a dense model)."""
    config = job.config
    if not config.is_moe:
        return []
    flags = [f"--num-experts {config.experts}", f"--moe-router-topk {config.experts_per_token}",
             f"--moe-ffn-hidden-size {config.routed_ffn}", "--moe-token-dispatcher-type alltoall"]
    if config.experts // job.ep > 1:
        flags.append("--moe-grouped-gemm")
    if config.shared_ffn:
        flags.append(f"--moe-shared-expert-intermediate-size {config.shared_ffn}")
        if config.shared_gate:
            flags.append("--moe-shared-expert-gate")
    moe = moe_blocks(config)
    if len(moe) < job.blocks:
        pattern = ",".join("1" if block in moe else "0" for block in range(job.blocks))
        flags.append(f"--moe-layer-freq '[{pattern}]'")
    return flags + [f"--expert-model-parallel-size {job.ep}", f"--expert-tensor-parallel-size {job.etp}"]


def write(job: EngineJob) -> str:
    flags = model_flags(job) + expert_flags(job) + [
        f"--tensor-model-parallel-size {job.tp}", f"--pipeline-model-parallel-size {job.pp}",
        *([f"--context-parallel-size {job.cp}"] if job.cp > 1 else []),
        *(["--sequence-parallel"] if job.sp else []), *layer_flags(job),
        f"--micro-batch-size {job.micro_batch_size}", f"--global-batch-size {job.global_batch}",
        *(["--use-distributed-optimizer"] if job.replicas > 1 and job.zero == 1 else []),
        *RECOMPUTE_FLAGS[job.recompute], *PRECISION_FLAGS[job.precision],
    ]
    nodes = max(1, job.world // job.devices_per_node)
    per_node = job.world // nodes
    head = ["#!/bin/sh",
            f"# {job.model} on {job.world} devices, from a uniap plan (Megatron-LM flags as of d98e8a6).",
            f"# data-parallel size = {job.world} / (tp {job.tp}{f' · cp {job.cp}' if job.cp > 1 else ''} · pp "
            f"{job.pp}) = {job.dp}; "
            f"{job.micro_batches} micro-batches per iteration.",
            "# Run from a Megatron-LM checkout on every node; add data, tokenizer and optimizer flags as arguments."]
    if not job.config.learned_positions and rope_of(job) is None:
        head += ["# The plan does not record this model's rope_theta or rope_scaling: Megatron-LM rotates with base",
                 "# 10000 unless given --rotary-base THETA (and --use-rope-scaling for rope_scaling of type llama3)."]
    if job.tp > 1 or job.cp > 1:
        head += ["# validate_args requires this with tensor or context parallelism on GPUs before Blackwell:",
                 "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    head.append(f"torchrun --nnodes {nodes} --nproc-per-node {per_node}{RENDEZVOUS if nodes > 1 else ''} {SCRIPT} \\")
    return "\n".join(head + [f"  {flag} \\" for flag in flags] + ['  "$@"']) + "\n"
