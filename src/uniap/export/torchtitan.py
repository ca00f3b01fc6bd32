"""torchtitan: a job config TOML (`torchrun ... -m torchtitan.train --job.config_file FILE`).

Checked against torchtitan 0.2.2 (`torchtitan/config/job_config.py`, the last release read from TOML; its
`ConfigManager` parses what `write` produces, tests/export/test_engine_parsers.py; tests/export/engine_readers.py
holds the schema of its JobConfig the files are checked against) and against torchtitan 0.3.0
and main at b5bcd76 (2026-08-21), whose recipes are Python config registries (`--module llama3 --config
llama3_8b`) that take the same `section.key` values as command-line overrides: the file's header carries that
command line (0.3.0's ConfigManager parses it too). 0.3.0 keeps 0.2.2's key names and picks activation
checkpointing by subcommand (`activation-checkpoint:full`); main renames the batch keys to token counts
(`training.num_tokens_per_microbatch_per_dp_rank`, `num_tokens_per_train_step`, `parallelism.num_pp_microbatches`),
given in the header as figures.

What torchtitan can express, from its source (0.2.2 `models/llama3/infra/parallelize.py`):
- ZeRO-3 is FSDP2 (`data_parallel_shard_degree`, `fsdp_reshard_after_forward = "always"`); ZeRO-2 is FSDP2
  without resharding after forward ("never"); ZeRO-1 has no counterpart;
- ZeRO-0 is DDP (`data_parallel_replicate_degree`), which raises "DDP has not supported > 1D parallelism"
  with tp or pp;
- tensor parallelism always shards the sequence (SequenceParallel norms, 0.2.2 has no switch);
- stages are any module lists per chunk (`module_fqns_per_model_part`), chunk j on rank j mod pp for the looped
  Interleaved1F1B; GPipe, 1F1B, Interleaved1F1B;
- training precision bfloat16 or float32 (`mixed_precision_param`); only the llama3 model family here.
"""

from __future__ import annotations

import shlex

from uniap.export.capability import ANY_SPLIT, EngineJob, EngineRules, block_layout_why_not
from uniap.spec.model import ModelConfig


def architecture_why_not(config: ModelConfig) -> str | None:
    """What of the model torchtitan 0.2.2's llama3 (`models/llama3/model/model.py`: bias-free nn.Linear everywhere,
    a separate `output` Linear, head_dim = dim // n_heads, RMSNorm, SwiGLU, full RoPE, no dropout) lacks."""
    biases = [part for part, on in (("q/k/v", config.qkv_bias), ("attention output", config.out_bias),
                                    ("MLP", config.mlp_bias)) if on]
    if biases:
        return f"its llama3 has no biases (the model has {', '.join(biases)} biases)"
    if config.tied_embeddings:
        return "its llama3 does not tie the output layer to the embedding (the model does)"
    if config.kv_channels:
        return f"its llama3 has no separate head_dim (the model's is {config.kv_channels}, not hidden / heads)"
    if config.norm != "rmsnorm" or config.qk_norm:
        return "its llama3 has RMSNorm before attention and MLP and no q/k norm"
    if not config.gated_mlp or config.activation != "silu":
        return "its llama3 MLP is SwiGLU"
    if config.learned_positions or config.rotary_fraction != 1.0:
        return "its llama3 rotates every head dimension with RoPE (no position table, no partial rotary)"
    if config.dropout:
        return "its llama3 has no dropout"
    return block_layout_why_not(config)


RULES = EngineRules(name="torchtitan", families=("llama",), precisions=("bf16", "fp32"), zero_stages=(0, 2, 3),
                    pipeline_zero_stages=(2, 3), tensor_parallel=True, sequence_parallel_always=True,
                    replicate_alone=True, pipeline_schedules=("gpipe", "1f1b", "interleaved-1f1b"), split=ANY_SPLIT,
                    architecture_why_not=architecture_why_not)

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
PRECISIONS = {"bf16": "bfloat16", "fp32": "float32"}
RESHARD = {2: "never", 3: "always"}
FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}
"""torchtitan's llama3 flavors for our zoo names; any other model needs a flavor registered with its sizes."""
RECIPES = {"llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b", "llama3-405b": "llama3_405b"}
"""torchtitan 0.3.0's llama3 config registry entries for them."""

def model_parts(job: EngineJob) -> list[list[str]]:
    """Module names per chunk in torchtitan's llama3 model: tok_embeddings, layers.i, norm, output."""
    parts, block = [], 0
    for j, count in enumerate(job.chunk_blocks):
        part = ["tok_embeddings"] if j == 0 else []
        part += [f"layers.{block + i}" for i in range(count)]
        block += count
        if j == len(job.chunk_blocks) - 1:
            part += ["norm", "output"]
        parts.append(part)
    return parts


def config_of(job: EngineJob) -> dict:
    """The TOML tables of the job (torchtitan 0.2.2 JobConfig sections)."""
    sharded = job.dp > 1 and job.zero > 0
    local = job.global_batch // job.dp if job.pp > 1 else job.micro_batch_size
    parallelism = {
        "data_parallel_replicate_degree": job.dp if job.dp > 1 and job.zero == 0 else 1,
        "data_parallel_shard_degree": job.dp if sharded else 1,
        "fsdp_reshard_after_forward": RESHARD[job.zero] if sharded else "default",
        "tensor_parallel_degree": job.tp,
        "pipeline_parallel_degree": job.pp,
        "pipeline_parallel_schedule": SCHEDULES[job.schedule],
        "pipeline_parallel_microbatch_size": job.micro_batch_size,
        "module_fqns_per_model_part": model_parts(job),
    }
    return {
        "job": {"description": f"uniap plan: {job.model}, {job.world} devices"},
        "model": {"name": "llama3", "flavor": FLAVORS.get(job.model, job.model)},
        "training": {"local_batch_size": local, "global_batch_size": job.global_batch, "seq_len": job.seq_len,
                     "mixed_precision_param": PRECISIONS[job.precision]},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": "full" if job.recompute else "none"},
    }


def recipe_arguments(job: EngineJob) -> list[str]:
    """torchtitan 0.3.0's command line for the job after `--module llama3 --config RECIPE`: the same keys as
    overrides (a list[str] is comma-separated there, one per model part), CUDA graphs off under a pipeline (0.3.0
    refuses both together), and the activation checkpoint choice."""
    tables = config_of(job)
    args = []
    for section in ("training", "parallelism"):
        for key, value in tables[section].items():
            parts = [",".join(part) for part in value] if isinstance(value, list) else [str(value)]
            args += [f"--{section}.{key}", *parts]
    if job.pp > 1:  # 0.3.0 refuses "CUDA graphs do not support pipeline parallelism yet"
        args.append("--training.disable_cuda_graphs")
    return args + [f"activation-checkpoint:{'full' if job.recompute else 'none'}"]


def write(job: EngineJob) -> str:
    """The TOML file (the model comes from the plan's name: torchtitan's flavors carry the sizes)."""
    recipe = RECIPES.get(job.model, "RECIPE")
    lines = [f"# {job.model} on {job.world} devices, from a uniap plan: a torchtitan 0.2.x job config",
             "# (torchrun ... -m torchtitan.train --job.config_file THIS_FILE).",
             "# torchtitan 0.3.0 has no TOML; the same plan as overrides of a llama3 config registry entry (RECIPE):",
             f"#   torchtitan 0.3.0: -m torchtitan.train --module llama3 --config {recipe} "
             f"{shlex.join(recipe_arguments(job))}",
             "# torchtitan main (after 0.3.0) counts batches in tokens: training.num_tokens_per_microbatch_per_dp_rank"
             f" = {job.micro_batch_size * job.seq_len}, training.num_tokens_per_train_step = "
             f"{job.global_batch * job.seq_len}, parallelism.num_pp_microbatches = "
             f"{job.micro_batches if job.pp > 1 else 1}."]
    if job.model not in FLAVORS:
        lines.append(f"# flavor {job.model!r} is not one of torchtitan's llama3 flavors ({', '.join(FLAVORS.values())})"
                     ": register it with the plan's model sizes.")
    for section, values in config_of(job).items():
        lines += ["", f"[{section}]"] + [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"
