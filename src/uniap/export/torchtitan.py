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
- recomputation: "full" is `activation_checkpoint.mode = "full"`; "selective-op" is `mode = "selective"` with
  `selective_ac_option = "op"`, torchtitan's per-op selective checkpointing (0.2.2
  `distributed/activation_checkpoint.py` `_apply_op_sac`, 0.3.0 `SelectiveAC`, the subcommand
  `activation-checkpoint:selective`), as the plan priced it. Megatron-LM's "selective" (the attention core alone)
  has no torchtitan policy and is refused;
- context parallelism is `parallelism.context_parallel_degree` cp (load balancer "headtail" by default: the
  halves of a causal sequence, as planned; keys and values all-gathered, `context_parallel_rotate_method`). FSDP
  always runs over dp_shard · cp with it (`ParallelDims.fsdp_enabled`), so cp takes ZeRO-2/3 over dp · cp, the
  plan's; the rank order is tp, cp, dp (mesh ["pp", "batch", "cp", "tp"]). `parallelize_llama` / `parallelize_qwen3`
  assert that the sequence is a multiple of tp · 2 · cp (`ParallelDims.seq_len_divisor`, with or without cp);
- fp8 is bf16 (`mixed_precision_param`) with torchao's Float8Linear: `model.converters =
  ["quantize.linear.float8"]` (0.2.2's registered name, `components/quantization/float8.py`; its docs' older
  "float8" is no longer registered) with `[quantize.linear.float8] filter_fqns` naming the output layer (and an
  MoE's router gate, as 0.3.0's deepseek_v3 recipe does) so that only the blocks' GEMMs run in fp8 (tensorwise
  dynamic scaling, the default recipe; tensor-parallel collectives stay bf16). An MoE's experts add
  "quantize.grouped_mm.float8" (`[quantize.grouped_mm.float8] fqns = ["experts"]`), a prototype that asserts
  pp = 1 and cp = 1 and needs torchao's nightly build. 0.3.0 sets converters in the config registry entry
  (`model_registry(FLAVOR, converters=[Float8LinearConverter.Config(filter_fqns=["lm_head"])])`; `model_spec` is
  not a command-line field): of the recipes here only llama3_405b converts, so its recipe is named for fp8 plans
  only and the header says what RECIPE needs otherwise;
- training precision bfloat16, float32 or fp8 as above; the llama3 and qwen3 models (`MODELS`).
  0.2.2's qwen3 has no pipelining (its TrainSpec's `pipelining_fn` is None: "does not support pipelining"), 0.3.0's
  has, but not with tied embeddings ("Weight tying is not supported with Pipeline Parallel");
- mixtures of experts in qwen3's MoE flavors (every block MoE, no shared expert, `moe_enabled`); llama3 has none.
  `parallelism.expert_parallel_degree` ep borrows its ranks from FSDP (over dp_shard · cp) and tp: the expert mesh is
  ["pp", "dp_replicate", "efsdp", "ep"] with efsdp = dp_shard · cp · tp / ep (0.2.2 and main b5bcd76
  `distributed/parallel_dims.py`, whose main raises unless ep divides dp_shard · cp · tp), so DDP's replicas
  (dp_replicate) lend none. 0.2.2 has `expert_tensor_parallel_degree` 1 or tp; main deprecated it (c4b409af2,
  2026-04-30) and 0.3.0 has none, so an expert stays whole under ep (0.2.2's default etp 1); with ep 1 and
  tp > 1 the experts are tensor-parallel like the MLP (qwen3's `apply_moe_ep_tp`): etp = tp.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from uniap.schedules import exported_schedules
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
    """ep borrows ranks from dp_shard · cp · tp (FSDP's shards, not DDP's replicas) and keeps each expert whole;
    without ep the experts are tensor-parallel like the MLP."""
    if s.ep == 1 and s.etp != s.tp:
        return f"its experts without expert parallelism are split like the MLP, etp = tp (the plan has {s.label()})"
    if s.ep > 1 and s.etp > 1:
        return f"its expert parallelism keeps each expert whole, etp 1 (the plan has {s.label()})"
    shards = (s.dp if s.zero >= 2 else 1) * s.cp
    if (shards * s.tp) % s.ep:
        return f"its expert parallelism borrows ranks from FSDP and tp (dp_shard · cp · tp = {shards * s.tp}, which " \
               f"ep {s.ep} does not divide; DDP's replicas lend none)"
    return None


def job_why_not(job: EngineJob) -> str | None:
    """0.2.2's float8 MoE training (`Float8GroupedMMConverter`) asserts "does not yet support pipeline
    parallelism" and "... context parallelism"."""
    if job.precision == "fp8" and job.config.is_moe and (job.pp > 1 or job.cp > 1):
        return "its float8 MoE training (quantize.grouped_mm.float8, a prototype) runs without pipeline and " \
               f"context parallelism (the plan has pp {job.pp}, cp {job.cp})"
    return None


def pipeline_why_not(config: ModelConfig) -> str | None:
    """Tied embeddings cannot be pipelined there (0.3.0's `Decoder.Config.update_from_config`; 0.2.2's qwen3 has
    no pipeline at all, which the file's header says)."""
    if config.tied_embeddings:
        return f"its {MODELS[config.family].name} does not pipeline a tied output layer"
    return None


SCHEDULES = exported_schedules("torchtitan")  # ours -> `pipeline_parallel_schedule`


def sequence_divisor(s: Strategy) -> int:
    """`ParallelDims.seq_len_divisor`: tp (sequence parallelism) · 2 · cp (the load balancer's halves)."""
    return s.tp * 2 * s.cp


RULES = EngineRules(name="torchtitan", families=tuple(MODELS), precisions=("bf16", "fp32", "fp8"),
                    recompute_levels=("none", "selective-op", "full"), context_parallel=True, zero_stages=(0, 2, 3),
                    pipeline_zero_stages=(2, 3), tensor_parallel=True, sequence_parallel_always=True,
                    replicate_alone=True, pipeline_schedules=tuple(SCHEDULES), split=ANY_SPLIT,
                    architecture_why_not=architecture_why_not, pipeline_why_not=pipeline_why_not,
                    expert_layout_why_not=expert_layout_why_not, sequence_divisor=sequence_divisor,
                    job_why_not=job_why_not,
                    absent={"selective": "its selective checkpointing is per op or every N-th layer, never the "
                                         "attention core alone (plan with selective-op, torchtitan's per-op policy)"})

PRECISIONS = {"bf16": "bfloat16", "fp32": "float32", "fp8": "bfloat16"}
AC_MODES = {"none": "none", "selective-op": "selective", "full": "full"}  # the plan's level -> activation_checkpoint.mode
RESHARD = {2: "never", 3: "always"}
FLOAT8 = "quantize.linear.float8"
FLOAT8_EXPERTS = "quantize.grouped_mm.float8"
"""0.2.2's registered converter names (`register_model_converter`): Float8Linear, and float8 grouped GEMMs."""
FLOAT8_RECIPES = frozenset({"llama3_405b"})
"""0.3.0's config registry entries of `FLAVORS` whose model converts to Float8Linear (filter_fqns ["lm_head"])."""


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
    sharded = job.replicas > 1 and job.zero > 0
    local = job.global_batch // job.dp if job.pp > 1 else job.micro_batch_size
    parallelism = {
        "data_parallel_replicate_degree": job.dp if job.dp > 1 and job.zero == 0 else 1,
        "data_parallel_shard_degree": job.dp if sharded else 1,
        "fsdp_reshard_after_forward": RESHARD[job.zero] if sharded else "default",
        "tensor_parallel_degree": job.tp,
        "context_parallel_degree": job.cp,
        "pipeline_parallel_degree": job.pp,
        "pipeline_parallel_schedule": SCHEDULES[job.schedule],
        "pipeline_parallel_microbatch_size": job.micro_batch_size,
        "module_fqns_per_model_part": model_parts(job, HEAD[release]),
    }
    if job.config.is_moe:
        parallelism["expert_parallel_degree"] = job.ep
    flavor = flavor_of(job.config)
    model = {"name": MODELS[job.config.family].name, "flavor": flavor.name if flavor else job.model}
    tables = {
        "job": {"description": f"uniap plan: {job.model}, {job.world} devices"},
        "model": model,
        "training": {"local_batch_size": local, "global_batch_size": job.global_batch, "seq_len": job.seq_len,
                     "mixed_precision_param": PRECISIONS[job.precision]},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": AC_MODES[job.recompute],
                                  **({"selective_ac_option": "op"} if job.recompute == "selective-op" else {})},
    }
    if job.precision == "fp8":  # the blocks' Linears (and grouped experts) in fp8; head and router stay bf16
        model["converters"] = [FLOAT8, FLOAT8_EXPERTS] if job.config.is_moe else [FLOAT8]
        tables[FLOAT8] = {"filter_fqns": [HEAD[release]] + (["router.gate"] if job.config.is_moe else [])}
        if job.config.is_moe:
            tables[FLOAT8_EXPERTS] = {"fqns": ["experts"]}
    return tables


def recipe_of(job: EngineJob) -> str:
    """The 0.3.0 config registry entry that builds the job's model as planned ("" where none does): the flavor's,
    if it converts to float8 exactly when the plan trains in fp8."""
    flavor = flavor_of(job.config)
    if flavor is None or not flavor.recipe or (flavor.recipe in FLOAT8_RECIPES) != (job.precision == "fp8"):
        return ""
    return flavor.recipe


def recipe_arguments(job: EngineJob) -> list[str]:
    """torchtitan 0.3.0's command line for the job after `--module MODEL --config RECIPE`: the same keys as
    overrides (a list[str] is comma-separated there, one per model part), CUDA graphs off under a pipeline (0.3.0
    refuses both together), and the activation checkpoint choice (its subcommands none, selective, full). Float8
    is not among them: 0.3.0 takes it from the config registry entry (`notes`)."""
    tables = config_of(job, "0.3.0")
    args = []
    for section in ("training", "parallelism"):
        for key, value in tables[section].items():
            parts = [",".join(part) for part in value] if isinstance(value, list) else [str(value)]
            args += [f"--{section}.{key}", *parts]
    if job.pp > 1:  # 0.3.0 refuses "CUDA graphs do not support pipeline parallelism yet"
        args.append("--training.disable_cuda_graphs")
    return args + [f"activation-checkpoint:{AC_MODES[job.recompute]}"]


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
        elif not recipe_of(job) and job.precision != "fp8":
            lines.append(f"# 0.3.0's {flavor.recipe} converts the blocks to float8, which this plan does not: RECIPE "
                         f"is an entry that builds {model.name} {flavor.name} without converters.")
        elif not recipe_of(job):
            lines.append(f"# 0.3.0's {flavor.recipe} does not convert to float8: RECIPE is an entry that builds "
                         f"{model.name} {flavor.name} with the converters below.")
    if job.precision == "fp8" and not recipe_of(job):
        experts = " and Float8GroupedExpertsConverter.Config()" if job.config.is_moe else ""
        lines.append(f"# fp8: 0.3.0 converts in the config registry entry, not on the command line: RECIPE's "
                     f"model_registry(..., converters=[Float8LinearConverter.Config(filter_fqns="
                     f"{[HEAD['0.3.0']] + (['router.gate'] if job.config.is_moe else [])}){experts}]).")
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
    model = MODELS[job.config.family]
    recipe = recipe_of(job) or "RECIPE"
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
