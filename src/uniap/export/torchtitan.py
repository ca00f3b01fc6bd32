"""torchtitan: a job config TOML (`torchrun ... -m torchtitan.train --job.config_file FILE`).

Checked against torchtitan 0.2.2 (`torchtitan/config/job_config.py`, the last release read from TOML; its
`ConfigManager` parses what `write` produces, tests/export/test_engine_parsers.py) and against torchtitan 0.3.0
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
import tomllib

from uniap.errors import UniapError
from uniap.export.capability import ANY_SPLIT, EngineJob, EngineRules
from uniap.spec.model import ModelConfig

RULES = EngineRules(name="torchtitan", families=("llama",), precisions=("bf16", "fp32"), zero_stages=(0, 2, 3),
                    pipeline_zero_stages=(2, 3), tensor_parallel=True, sequence_parallel_always=True,
                    replicate_alone=True, pipeline_schedules=("gpipe", "1f1b", "interleaved-1f1b"), split=ANY_SPLIT)

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
PRECISIONS = {"bf16": "bfloat16", "fp32": "float32"}
RESHARD = {2: "never", 3: "always"}
FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}
"""torchtitan's llama3 flavors for our zoo names; any other model needs a flavor registered with its sizes."""
RECIPES = {"llama3-8b": "llama3_8b", "llama3-70b": "llama3_70b", "llama3-405b": "llama3_405b"}
"""torchtitan 0.3.0's llama3 config registry entries for them."""

SCHEMA = {
    "job": {"description": str},
    "model": {"name": str, "flavor": str},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int, "mixed_precision_param": str},
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": str, "tensor_parallel_degree": int,
                    "pipeline_parallel_degree": int, "pipeline_parallel_schedule": str,
                    "pipeline_parallel_microbatch_size": int, "module_fqns_per_model_part": list},
    "activation_checkpoint": {"mode": str},
}
"""The sections and keys written, with their types, as torchtitan 0.2.2's JobConfig dataclasses declare them."""

CHOICES = {("training", "mixed_precision_param"): ("bfloat16", "float32"),
           ("parallelism", "fsdp_reshard_after_forward"): ("default", "always", "never"),
           ("activation_checkpoint", "mode"): ("selective", "full", "memory_budget", "none")}
"""The Literal fields' values in 0.2.2."""


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


def write(job: EngineJob, config: ModelConfig) -> str:
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


def read(text: str) -> dict:
    """The settings a torchtitan TOML carries (`EngineJob.settings`), after checking it against `SCHEMA`."""
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UniapError(f"not a TOML file: {exc}") from None
    for section, values in config.items():
        if section not in SCHEMA or not isinstance(values, dict):
            raise UniapError(f"torchtitan config: unknown section [{section}]")
        for key, value in values.items():
            kind = SCHEMA[section].get(key)
            if kind is None or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise UniapError(f"torchtitan config: [{section}] {key} = {value!r} is not a known "
                                 f"{kind.__name__ if kind else 'key'}")
            if (section, key) in CHOICES and value not in CHOICES[section, key]:
                raise UniapError(f"torchtitan config: [{section}] {key} must be one of {CHOICES[section, key]}")
    try:
        training, par = config["training"], config["parallelism"]
        replicate, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
        pp, parts = par["pipeline_parallel_degree"], par["module_fqns_per_model_part"]
        dp = replicate * shard
        local = training["local_batch_size"]
        accumulation = training["global_batch_size"] // (local * dp)
        micro_size = par["pipeline_parallel_microbatch_size"] if pp > 1 else local
        reshard = {"always": 3, "never": 2, "default": 2 if pp > 1 else 3}  # "default": no resharding with pp
        zero = reshard[par["fsdp_reshard_after_forward"]] if shard > 1 else 0
        schedule = {name: ours for ours, name in SCHEDULES.items()}[par["pipeline_parallel_schedule"]]
        return {"tp": par["tensor_parallel_degree"], "dp": dp, "pp": pp, "zero": zero,
                "sp": par["tensor_parallel_degree"] > 1, "recompute": config["activation_checkpoint"]["mode"] == "full",
                "global_batch": training["global_batch_size"], "micro_batches": accumulation * (local // micro_size),
                "micro_batch_size": micro_size,
                "precision": {name: ours for ours, name in PRECISIONS.items()}[training["mixed_precision_param"]],
                "schedule": schedule if pp > 1 else None, "virtual_stages": len(parts) // pp,
                "chunk_blocks": tuple(sum(name.startswith("layers.") for name in part) for part in parts)}
    except (KeyError, ZeroDivisionError) as exc:
        raise UniapError(f"torchtitan config lacks or mis-sets {exc}") from None
