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
  without resharding after forward ("never"), which still gathers the parameters in every micro-batch's forward
  (torchtitan reshards after each backward) where the plan prices one gather per iteration; under a pipeline,
  torch's PipelineStage holds unsharded gradients over the micro-batches instead (`set_requires_gradient_sync(
  False)` until the last backward). The file says which; ZeRO-1 has no counterpart;
- ZeRO-0 is DDP (`data_parallel_replicate_degree`), which raises "DDP has not supported > 1D parallelism"
  with tp or pp;
- tensor parallelism always shards the sequence (SequenceParallel norms, 0.2.2 has no switch);
- stages are any module lists per chunk (`module_fqns_per_model_part`), chunk j on rank j mod pp for the looped
  Interleaved1F1B; GPipe, 1F1B, Interleaved1F1B. The output layer is `output` in 0.2.2 and `lm_head` in 0.3.0
  (its `Decoder`), so the TOML and the header's command line name it each their way;
- training precision bfloat16 or float32 (`mixed_precision_param`); the llama3 and qwen3 models (`MODELS`).
  0.2.2's qwen3 has no pipelining (its TrainSpec's `pipelining_fn` is None: "does not support pipelining"), 0.3.0's
  has, but not with tied embeddings ("Weight tying is not supported with Pipeline Parallel");
- mixtures of experts in qwen3's MoE flavors (every block MoE, no shared expert, `moe_enabled`); llama3 has none.
  `parallelism.expert_parallel_degree` ep borrows its ranks from FSDP and tp: the expert mesh is
  ["pp", "dp_replicate", "efsdp", "ep"] with efsdp = dp_shard · cp · tp / ep (0.2.2 and main b5bcd76
  `distributed/parallel_dims.py`, whose main raises unless ep divides dp_shard · cp · tp), so DDP's replicas
  (dp_replicate) lend none. 0.2.2 has `expert_tensor_parallel_degree` 1 or tp; main deprecated it (c4b409af2,
  2026-04-30) and 0.3.0 has none, so an expert stays whole under ep (0.2.2's default etp 1); with ep 1 and
  tp > 1 the experts are tensor-parallel like the MLP (qwen3's `apply_moe_ep_tp`): etp = tp.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from uniap.export.capability import ANY_SPLIT, EngineJob, EngineRules, Rope, block_layout_why_not, moe_blocks, \
    rope_of
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy


@dataclass(frozen=True)
class TitanModel:
    """One of torchtitan's decoder implementations, as far as the plan's architecture goes."""

    name: str
    """Its `model.name` (0.2.2) and `--module` (0.3.0)."""
    qk_norm: str
    """Its q/k norm in our terms: "" none (llama3), "head" (qwen3's q_norm/k_norm, RMSNorm over head_dim)."""
    ties: bool
    """It can tie the output layer to the embedding (`enable_weight_tying`)."""
    separate_head_dim: bool
    """head_dim is its own argument; else it is dim // n_heads."""
    experts: bool
    """It has MoE flavors (every block MoE, no shared expert)."""


MODELS = {"llama": TitanModel("llama3", "", ties=False, separate_head_dim=False, experts=False),
          "qwen3": TitanModel("qwen3", "head", ties=True, separate_head_dim=True, experts=True),
          "qwen3_moe": TitanModel("qwen3", "head", ties=True, separate_head_dim=True, experts=True)}
"""Our families torchtitan has (0.2.2 and 0.3.0 `models/llama3`, `models/qwen3`: bias-free Linears, RMSNorm,
SwiGLU, full RoPE, no dropout)."""

HEAD = {"0.2.2": "output", "0.3.0": "lm_head"}
"""The output layer's module name by release: `module_fqns_per_model_part` must name it on the last chunk."""


def architecture_why_not(config: ModelConfig) -> str | None:
    """What of the model torchtitan's implementation of its family (`MODELS`) lacks."""
    model = MODELS[config.family]
    biases = [part for part, on in (("q/k/v", config.qkv_bias), ("attention output", config.out_bias),
                                    ("MLP", config.mlp_bias)) if on]
    if biases:
        return f"its {model.name} has no biases (the model has {', '.join(biases)} biases)"
    if config.tied_embeddings and not model.ties:
        return f"its {model.name} does not tie the output layer to the embedding (the model does)"
    if config.kv_channels and not model.separate_head_dim:
        return f"its {model.name} has no separate head_dim (the model's is {config.kv_channels}, not hidden / heads)"
    if config.norm != "rmsnorm" or config.qk_norm != model.qk_norm:
        norms = "and q/k norms over head_dim" if model.qk_norm else "and no q/k norm"
        return f"its {model.name} has RMSNorm before attention and MLP {norms}"
    if not config.gated_mlp or config.activation != "silu":
        return f"its {model.name} MLP is SwiGLU"
    if config.learned_positions or config.rotary_fraction != 1.0:
        return f"its {model.name} rotates every head dimension with RoPE (no position table, no partial rotary)"
    if config.dropout:
        return f"its {model.name} has no dropout"
    if config.kv_lora_rank:
        return f"its {model.name} has no multi-head latent attention"
    if config.mtp_layers:
        return f"its {model.name} has no multi-token prediction (the model has {config.mtp_layers} MTP modules)"
    return experts_why_not(config, model) or block_layout_why_not(config)


def experts_why_not(config: ModelConfig, model: TitanModel) -> str | None:
    """What of the model's mixture of experts torchtitan's implementation of its family lacks."""
    if not config.is_moe:
        return None
    if not model.experts:
        return f"its {model.name} has no mixture of experts"
    if len(moe_blocks(config)) < config.layers:
        return f"its {model.name} MoE makes every block MoE (the model has {len(moe_blocks(config))} of {config.layers})"
    if config.shared_ffn or config.router_bias or config.expert_bias:
        return f"its {model.name} MoE has no shared expert and no router or expert biases"
    return None


def expert_layout_why_not(s: Strategy) -> str | None:
    """ep borrows ranks from dp_shard · tp (FSDP's shards, not DDP's replicas) and keeps each expert whole; without
    ep the experts are tensor-parallel like the MLP."""
    if s.ep == 1 and s.etp != s.tp:
        return f"its experts without expert parallelism are split like the MLP, etp = tp (the plan has {s.label()})"
    if s.ep > 1 and s.etp > 1:
        return f"its expert parallelism keeps each expert whole, etp 1 (the plan has {s.label()})"
    shards = s.dp if s.zero >= 2 else 1
    if (shards * s.tp) % s.ep:
        return f"its expert parallelism borrows ranks from FSDP and tp (dp_shard · tp = {shards * s.tp}, which ep " \
               f"{s.ep} does not divide; DDP's replicas lend none)"
    return None


def pipeline_why_not(config: ModelConfig) -> str | None:
    """Tied embeddings cannot be pipelined there (0.3.0's `Decoder.Config.update_from_config`; 0.2.2's qwen3 has
    no pipeline at all, which the file's header says)."""
    if config.tied_embeddings:
        return f"its {MODELS[config.family].name} does not pipeline a tied output layer"
    return None


RULES = EngineRules(name="torchtitan", families=tuple(MODELS), precisions=("bf16", "fp32"), zero_stages=(0, 2, 3),
                    pipeline_zero_stages=(2, 3), tensor_parallel=True, sequence_parallel_always=True,
                    replicate_alone=True, pipeline_schedules=("gpipe", "1f1b", "interleaved-1f1b"), split=ANY_SPLIT,
                    architecture_why_not=architecture_why_not, pipeline_why_not=pipeline_why_not,
                    expert_layout_why_not=expert_layout_why_not)

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
PRECISIONS = {"bf16": "bfloat16", "fp32": "float32"}
RESHARD = {2: "never", 3: "always"}


@dataclass(frozen=True)
class Flavor:
    """A model size torchtitan registers, in ModelConfig terms (0.2.2 `llama3_args` / `qwen3_args` and 0.3.0
    `llama3_configs` / `qwen3_configs` give these names the same figures)."""

    family: str
    name: str
    recipe: str
    """0.3.0's config registry entry for it ("" where it has none)."""
    figures: tuple[int, int, int, int, int, int, int, bool]
    """Blocks, hidden, heads, key/value heads, MLP width (0: every block MoE), vocabulary, head_dim, tied."""
    rope: Rope
    experts: tuple[int, int, int] = (0, 0, 0)
    """Routed experts, experts per token and an expert's inner size ((0, 0, 0): dense)."""

    def fits(self, config: ModelConfig) -> bool:
        dense_ffn = config.ffn if len(moe_blocks(config)) < config.layers else 0
        experts = (config.experts, config.experts_per_token, config.routed_ffn) if config.is_moe else (0, 0, 0)
        same_model = config.family in MODELS and MODELS[config.family].name == MODELS[self.family].name
        return same_model and self.experts == experts and self.figures == (
            config.layers, config.hidden, config.heads, config.n_kv_heads, dense_ffn, config.vocab, config.head_dim,
            config.tied_embeddings)


_LLAMA3, _QWEN3 = Rope(500000, True), Rope(1000000, False)  # torchtitan's llama3 always scales as Llama 3.1 does
FLAVORS = (
    Flavor("llama", "8B", "llama3_8b", (32, 4096, 32, 8, 14336, 128256, 128, False), _LLAMA3),
    Flavor("llama", "70B", "llama3_70b", (80, 8192, 64, 8, 28672, 128256, 128, False), _LLAMA3),
    Flavor("llama", "405B", "llama3_405b", (126, 16384, 128, 8, 53248, 128256, 128, False), _LLAMA3),
    Flavor("qwen3", "0.6B", "qwen3_0_6b", (28, 1024, 16, 8, 3072, 151936, 128, True), _QWEN3),
    Flavor("qwen3", "1.7B", "qwen3_1_7b", (28, 2048, 16, 8, 6144, 151936, 128, True), _QWEN3),
    Flavor("qwen3", "4B", "", (36, 2560, 32, 8, 9728, 151936, 128, True), _QWEN3),
    Flavor("qwen3", "8B", "", (36, 4096, 32, 8, 12288, 151936, 128, False), _QWEN3),
    Flavor("qwen3", "14B", "qwen3_14b", (40, 5120, 40, 8, 17408, 151936, 128, False), _QWEN3),
    Flavor("qwen3", "32B", "qwen3_32b", (64, 5120, 64, 8, 25600, 151936, 128, False), _QWEN3),
    Flavor("qwen3", "30B-A3B", "qwen3_30b_a3b", (48, 2048, 32, 4, 0, 151936, 128, False), _QWEN3, (128, 8, 768)),
    Flavor("qwen3", "235B-A22B", "", (94, 4096, 64, 4, 0, 151936, 128, False), Rope(5000000, False),
           (128, 8, 1536)),
)
"""The flavors (0.2.2's `qwen3_args` and 0.3.0's `qwen3_configs` MoE ones: every block MoE, their dense
`hidden_dim` unused); a model of other figures needs a flavor registered with its sizes."""


def flavor_of(config: ModelConfig) -> Flavor | None:
    """The flavor that builds this architecture, whatever the model is called (a Llama 3.1 8B config is `8B`)."""
    return next((flavor for flavor in FLAVORS if flavor.fits(config)), None)


def model_parts(job: EngineJob, head: str) -> list[list[str]]:
    """Module names per chunk in torchtitan's decoders: tok_embeddings, layers.i, norm and the output layer
    `head` (`HEAD` of the release)."""
    parts, block = [], 0
    for j, count in enumerate(job.chunk_blocks):
        part = ["tok_embeddings"] if j == 0 else []
        part += [f"layers.{block + i}" for i in range(count)]
        block += count
        if j == len(job.chunk_blocks) - 1:
            part += ["norm", head]
        parts.append(part)
    return parts


def config_of(job: EngineJob, release: str) -> dict:
    """The TOML tables of the job (torchtitan 0.2.2 JobConfig sections), its modules named as `release` names
    them."""
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
        "module_fqns_per_model_part": model_parts(job, HEAD[release]),
    }
    if job.config.is_moe:
        parallelism["expert_parallel_degree"] = job.ep
    flavor = flavor_of(job.config)
    return {
        "job": {"description": f"uniap plan: {job.model}, {job.world} devices"},
        "model": {"name": MODELS[job.config.family].name, "flavor": flavor.name if flavor else job.model},
        "training": {"local_batch_size": local, "global_batch_size": job.global_batch, "seq_len": job.seq_len,
                     "mixed_precision_param": PRECISIONS[job.precision]},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": "full" if job.recompute else "none"},
    }


def recipe_arguments(job: EngineJob) -> list[str]:
    """torchtitan 0.3.0's command line for the job after `--module MODEL --config RECIPE`: the same keys as
    overrides (a list[str] is comma-separated there, one per model part), CUDA graphs off under a pipeline (0.3.0
    refuses both together), and the activation checkpoint choice."""
    tables = config_of(job, "0.3.0")
    args = []
    for section in ("training", "parallelism"):
        for key, value in tables[section].items():
            parts = [",".join(part) for part in value] if isinstance(value, list) else [str(value)]
            args += [f"--{section}.{key}", *parts]
    if job.pp > 1:  # 0.3.0 refuses "CUDA graphs do not support pipeline parallelism yet"
        args.append("--training.disable_cuda_graphs")
    return args + [f"activation-checkpoint:{'full' if job.recompute else 'none'}"]


def notes(job: EngineJob) -> list[str]:
    """What the header must say beyond the settings: the flavor and its RoPE, what ZeRO-2 is there, and what a
    release cannot run."""
    model, flavor = MODELS[job.config.family], flavor_of(job.config)
    lines = []
    if flavor is None:
        lines.append(f"# No torchtitan {model.name} flavor has this model's sizes: register one named {job.model!r} "
                     "with them (0.3.0: a config registry entry for RECIPE).")
    else:
        scaling = " with Llama 3.1's frequency scaling" if flavor.rope.llama3_scaling else ""
        lines.append(f"# flavor {flavor.name}: {model.name} with the plan's sizes, RoPE base {flavor.rope.base}"
                     f"{scaling}.")
        known = rope_of(job)
        if known and known != flavor.rope:
            lines.append(f"# {job.model} rotates with base {known.base}"
                         f"{' with' if known.llama3_scaling else ' without'} that scaling: torchtitan trains the "
                         "flavor's positions.")
        if not flavor.recipe:
            lines.append(f"# 0.3.0 has no config registry entry for {model.name} {flavor.name}: RECIPE is one that "
                         "builds it.")
    if job.dp > 1 and job.zero >= 2 and job.pp > 1:
        lines += ["# Under a pipeline torch's PipelineStage keeps FSDP2's gradients unsharded over the micro-batches",
                  "# and reduce-scatters them once per iteration: each rank holds its stage's whole gradients, which",
                  f"# the plan's ZeRO-{job.zero} shards (and prices a reduce-scatter per micro-batch)."]
    elif job.dp > 1 and job.zero == 2:
        lines += ["# ZeRO-2 here is FSDP2 without resharding after forward, and torchtitan reshards after every",
                  f"# backward: each of the {job.micro_batches} micro-batches gathers the parameters again (beside its "
                  "forward, as ZeRO-3's",
                  "# gathers are), where the plan priced one gather per iteration; peak memory is as planned."]
    if job.pp > 1 and model.name == "qwen3":
        lines.append("# torchtitan 0.2.2's qwen3 has no pipeline (\"does not support pipelining\"): run this plan "
                     "with 0.3.0's command line.")
    return lines


def write(job: EngineJob) -> str:
    """The TOML file; the flavor is the one torchtitan registers with the plan's sizes, whatever its name."""
    model, flavor = MODELS[job.config.family], flavor_of(job.config)
    recipe = flavor.recipe if flavor and flavor.recipe else "RECIPE"
    lines = [f"# {job.model} on {job.world} devices, from a uniap plan: a torchtitan 0.2.x job config",
             "# (torchrun ... -m torchtitan.train --job.config_file THIS_FILE).",
             f"# torchtitan 0.3.0 has no TOML; the same plan as overrides of a {model.name} config registry entry "
             "(RECIPE):",
             f"#   torchtitan 0.3.0: -m torchtitan.train --module {model.name} --config {recipe} "
             f"{shlex.join(recipe_arguments(job))}",
             "# torchtitan main (after 0.3.0) counts batches in tokens: training.num_tokens_per_microbatch_per_dp_rank"
             f" = {job.micro_batch_size * job.seq_len}, training.num_tokens_per_train_step = "
             f"{job.global_batch * job.seq_len}, parallelism.num_pp_microbatches = "
             f"{job.micro_batches if job.pp > 1 else 1}.", *notes(job)]
    for section, values in config_of(job, "0.2.2").items():
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
