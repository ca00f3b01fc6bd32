"""Exported files read back: each engine's configuration checked against a schema of what that engine's own
config code declares (types, choices, its validation rules), giving the plan settings it carries
(`settings_of`). Test oracles only: the package writes these files, it never reads them."""

import argparse
import json
import math
import re
import shlex
import tomllib

from uniap.errors import UniapError
from uniap.export import megatron, torchtitan
from uniap.export.capability import EngineJob, Rope


def settings_of(job: EngineJob) -> dict:
    """What an engine's configuration must carry of the plan: an exported file, read back, gives these (the
    schedule only matters with a pipeline)."""
    return {"tp": job.tp, "dp": job.dp, "pp": job.pp, "cp": job.cp, "zero": job.zero if job.replicas > 1 else 0,
            "sp": job.sp, "recompute": job.recompute, "global_batch": job.global_batch,
            "micro_batches": job.micro_batches, "micro_batch_size": job.micro_batch_size,
            "precision": job.precision, "schedule": job.schedule if job.pp > 1 else None,
            "virtual_stages": job.virtual_stages, "chunk_blocks": tuple(job.chunk_blocks)}


def _megatron_parser() -> argparse.ArgumentParser:
    """The flags `megatron.write` uses, with the types and choices of Megatron-LM's arguments.py and
    TransformerConfig (d98e8a6)."""
    p = argparse.ArgumentParser(prog="megatron", add_help=False, exit_on_error=False)
    for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--seq-length",
                 "--max-position-embeddings", "--kv-channels", "--num-query-groups", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--num-virtual-stages-per-pipeline-rank",
                 "--num-layers-per-virtual-pipeline-stage", "--micro-batch-size", "--global-batch-size",
                 "--recompute-num-layers", "--context-parallel-size"):
        p.add_argument(flag, type=int, default=1 if flag.endswith("-parallel-size") else None)
    p.add_argument("--rotary-base", type=int, default=10000)
    for flag in ("--attention-dropout", "--hidden-dropout", "--rotary-percent"):
        p.add_argument(flag, type=float, default=1.0 if flag == "--rotary-percent" else 0.1)
    for flag in ("--group-query-attention", "--swiglu", "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm",
                 "--untie-embeddings-and-output-weights", "--sequence-parallel", "--use-distributed-optimizer",
                 "--bf16", "--fp16", "--use-rope-scaling"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    p.add_argument("--position-embedding-type", choices=("learned_absolute", "rope", "mrope", "relative", "none"),
                   default="learned_absolute")
    p.add_argument("--recompute-granularity", choices=("full", "selective"))
    p.add_argument("--recompute-method", choices=("uniform", "block"))
    # TransformerConfig's recompute_modules (List[str] → nargs "+"; None is ["core_attn"]), fp8 fields (`fp8` is
    # --fp8-format by its argparse_meta) and arguments.py's --cp-comm-type
    p.add_argument("--recompute-modules", nargs="+", type=str)
    p.add_argument("--fp8-format", dest="fp8", choices=("e4m3", "hybrid"))
    p.add_argument("--fp8-recipe", choices=("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
                   default="delayed")
    p.add_argument("--fp8-amax-history-len", type=int, default=1)
    p.add_argument("--fp8-amax-compute-algo", choices=("most_recent", "max"), default="most_recent")
    p.add_argument("--cp-comm-type", nargs="+", type=str, default=["p2p"])
    # Mixtures of experts and MLA: arguments.py `_add_moe_args` (--num-experts, --moe-layer-freq as `moe_freq_type`),
    # `_add_mla_args` (its defaults) and the TransformerConfig / ModelParallelConfig fields ArgumentGroupFactory
    # makes flags of (Optional[int] → int, bool False → store_true, Literal → choices)
    for flag in ("--num-experts", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--q-lora-rank",
                 "--expert-tensor-parallel-size"):
        p.add_argument(flag, type=int)
    p.add_argument("--moe-router-topk", type=int, default=2)
    p.add_argument("--expert-model-parallel-size", type=int, default=1)
    for flag, default in (("--kv-lora-rank", 32), ("--qk-head-dim", 128), ("--qk-pos-emb-head-dim", 64),
                          ("--v-head-dim", 128)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--moe-layer-freq", type=_moe_freq, default=1)
    p.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall", "flex"), default="allgather")
    for flag in ("--moe-grouped-gemm", "--moe-shared-expert-gate", "--multi-latent-attention"):
        p.add_argument(flag, action="store_true")
    return p


def _moe_freq(text: str) -> list[int]:
    """arguments.py `moe_freq_type`: an int N (every N-th layer MoE) or a list expression of 0s and 1s."""
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(f"Invalid pattern: {text}")
    return eval(text) if "[" in text else int(text)  # the characters allowed make it a list or an int


MEGATRON_SCHEMA = _megatron_parser()


def megatron_arguments(text: str) -> tuple[int, argparse.Namespace]:
    """The world size of a launch script and its pretrain_gpt.py flags, parsed by `MEGATRON_SCHEMA`."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    if "torchrun" not in words or megatron.SCRIPT not in words:
        raise UniapError(f"not a Megatron-LM launch (torchrun ... {megatron.SCRIPT})")
    launch = words[words.index("torchrun") + 1:words.index(megatron.SCRIPT)]
    try:
        world = int(launch[launch.index("--nnodes") + 1]) * int(launch[launch.index("--nproc-per-node") + 1])
        flags = [w for w in words[words.index(megatron.SCRIPT) + 1:] if w != "$@"]
        args, unknown = MEGATRON_SCHEMA.parse_known_args(flags)
    except (ValueError, IndexError, argparse.ArgumentError) as exc:
        raise UniapError(f"Megatron-LM flags: {exc}") from None
    if unknown:
        raise UniapError(f"Megatron-LM flags: not among the flags checked: {' '.join(unknown)}")
    return world, args


def megatron_environment(text: str) -> dict[str, str]:
    """The variables a launch script exports before torchrun (`export NAME=VALUE` lines)."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    launch = words.index("torchrun") if "torchrun" in words else len(words)
    return dict(w.split("=", 1) for i, w in enumerate(words[:launch]) if i and words[i - 1] == "export")


def megatron_rope(args: argparse.Namespace) -> Rope:
    """RoPE as Megatron-LM's GPT model builds it from the flags (RotaryEmbedding(rotary_base, rope_scaling))."""
    return Rope(args.rotary_base, args.use_rope_scaling)


def read_megatron(text: str) -> dict:
    """The settings a launch script carries (`settings_of`), checked as Megatron-LM's validate_args does (on a
    GPU before Blackwell, where tensor parallelism asserts CUDA_DEVICE_MAX_CONNECTIONS=1)."""
    world, args = megatron_arguments(text)
    needed = (("--num-layers", args.num_layers), ("--micro-batch-size", args.micro_batch_size),
              ("--global-batch-size", args.global_batch_size))
    missing = [flag for flag, value in needed if value is None]
    if missing:
        raise UniapError(f"Megatron-LM flags: {', '.join(missing)} missing")
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    if world % (tp * cp * pp):
        raise UniapError(f"Megatron-LM flags: world size ({world}) is not divisible by total_model_size "
                         f"({tp * cp * pp})")
    dp = world // (tp * cp * pp)
    if args.global_batch_size % (args.micro_batch_size * dp):
        raise UniapError("Megatron-LM flags: global batch is not a multiple of micro-batch size × data-parallel size")
    if cp > 1 and args.seq_length % (2 * cp):
        raise UniapError("Megatron-LM flags: seq-length should be a multiple of 2 * context-parallel-size if "
                         "context-parallel-size > 1.")
    if (tp > 1 or cp > 1) and megatron_environment(text).get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        raise UniapError("Megatron-LM: using tensor model parallelism or context parallelism require setting the "
                         "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
    if args.sequence_parallel and tp == 1:
        raise UniapError("Megatron-LM flags: --sequence-parallel without tensor parallelism is switched off")
    recompute = _megatron_recompute(args, pp)
    if args.fp8 and args.fp16:
        raise UniapError("Megatron-LM flags: fp8 here is bf16 training with fp8 GEMMs (--bf16), not fp16")
    _check_megatron_experts(args, world, tp, pp)
    return {"tp": tp, "dp": dp, "pp": pp, "cp": cp, "zero": int(args.use_distributed_optimizer and dp * cp > 1),
            "sp": args.sequence_parallel, "recompute": recompute,
            "global_batch": args.global_batch_size,
            "micro_batches": args.global_batch_size // (args.micro_batch_size * dp),
            "micro_batch_size": args.micro_batch_size,
            "precision": "fp8" if args.fp8 else "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            **_megatron_split(args, pp)}


def _megatron_recompute(args: argparse.Namespace, pp: int) -> str:
    """The recompute level of every block, by validate_args' and TransformerConfig.__post_init__'s rules: selective
    takes no method and no layer count, and recomputes its modules (default ["core_attn"]: the attention core);
    full needs a layer count, and recomputes every layer with the uniform method and 1 layer per unit."""
    granularity = args.recompute_granularity
    if granularity is None:
        return "none"
    if granularity == "selective":
        if args.recompute_method is not None:
            raise UniapError("Megatron-LM flags: recompute method is not yet supported for selective recomputing "
                             "granularity")
        if args.recompute_num_layers is not None:
            raise UniapError("Megatron-LM flags: When using recompute_granularity: selective recompute_num_layers "
                             "must be None.")
        if (args.recompute_modules or ["core_attn"]) != ["core_attn"]:
            raise UniapError(f"Megatron-LM flags: recompute modules {args.recompute_modules} are not the attention "
                             "core alone")
        return "selective"
    if args.recompute_num_layers is None:
        raise UniapError("Megatron-LM flags: When using recompute_granularity: full recompute_num_layers must be "
                         "between 1 and num_layers_per_pipeline_rank")
    if (args.recompute_method, args.recompute_num_layers) != ("uniform", 1):
        raise UniapError("Megatron-LM flags: full recompute of some layers only (not every layer)")
    return "full"


def _check_megatron_experts(args: argparse.Namespace, world: int, tp: int, pp: int) -> None:
    """The expert rules of validate_args, initialize_model_parallel, the layer specs and MoELayer.forward."""
    ep, etp = args.expert_model_parallel_size, args.expert_tensor_parallel_size or tp
    if ep > 1 and (args.num_experts is None or args.num_experts % ep):
        raise UniapError("Megatron-LM flags: Number of experts should be a multiple of expert model parallel_size.")
    if world % (etp * ep * pp):
        raise UniapError(f"Megatron-LM flags: world_size ({world}) is not divisible by "
                         f"expert_tensor_model_pipeline_parallel size ({etp * ep * pp})")
    if args.num_experts and tp > 1 and not args.sequence_parallel:
        raise UniapError("Megatron-LM: During training, performance may degrade if MoE and tensor parallelism"
                         "are enabled without also enabling sequence parallelism.")
    if isinstance(args.moe_layer_freq, list) and len(args.moe_layer_freq) != args.num_layers:
        raise UniapError(f"Megatron-LM flags: Invalid length of moe_layer_pattern: {len(args.moe_layer_freq)}")


def _megatron_split(args: argparse.Namespace, pp: int) -> dict:
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


TORCHTITAN_SCHEMA = {
    "job": {"description": str},
    "model": {"name": str, "flavor": str, "converters": list},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int, "mixed_precision_param": str},
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": str, "tensor_parallel_degree": int,
                    "context_parallel_degree": int, "context_parallel_load_balancer": str,
                    "pipeline_parallel_degree": int, "pipeline_parallel_schedule": str,
                    "pipeline_parallel_microbatch_size": int, "module_fqns_per_model_part": list,
                    "expert_parallel_degree": int, "expert_tensor_parallel_degree": int},
    "activation_checkpoint": {"mode": str, "selective_ac_option": str},
    "quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": bool,
                                       "precompute_float8_dynamic_scale_for_fsdp": bool, "recipe_name": str,
                                       "filter_fqns": list, "emulate": bool}},
                 "grouped_mm": {"float8": {"fqns": list}}},
}
"""The sections and keys written, with their types, as torchtitan 0.2.2's JobConfig dataclasses declare them
(`quantize` nests QuantizedLinear / QuantizedGroupedMM: TOML's [quantize.linear.float8])."""

TORCHTITAN_CHOICES = {("training", "mixed_precision_param"): ("bfloat16", "float32"),
           ("parallelism", "fsdp_reshard_after_forward"): ("default", "always", "never"),
           ("activation_checkpoint", "mode"): ("selective", "full", "memory_budget", "none"),
           ("quantize", "linear", "float8", "recipe_name"): ("tensorwise", "rowwise", "rowwise_with_gw_hp")}
"""The Literal fields' values in 0.2.2."""

TORCHTITAN_CONVERTERS = ("quantize.linear.float8", "quantize.grouped_mm.float8", "quantize.linear.mx",
                         "quantize.grouped_mm.mx")
"""0.2.2's registered model converters (`register_model_converter` in components/quantization/float8.py and
mx.py): `ModelConvertersContainer` looks each name of `model.converters` up, a KeyError for any other (the old
"float8" included)."""


def _check_torchtitan_table(path: tuple[str, ...], values: dict, schema: dict) -> None:
    """`values` (a TOML table at `path`) against `schema`: every key known, of its type, among its choices."""
    for key, value in values.items():
        kind = schema.get(key)
        where = ".".join(path)
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise UniapError(f"torchtitan config: [{where}] {key} is a section")
            _check_torchtitan_table(path + (key,), value, kind)
            continue
        if kind is None or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UniapError(f"torchtitan config: [{where}] {key} = {value!r} is not a known "
                             f"{kind.__name__ if kind else 'key'}")
        choices = TORCHTITAN_CHOICES.get(path + (key,))
        if choices and value not in choices:
            raise UniapError(f"torchtitan config: [{where}] {key} must be one of {choices}")

TORCHTITAN_MODULES = {"0.2.2": ("tok_embeddings", "layers", "norm", "output"),
                      "0.3.0": ("tok_embeddings", "layers", "norm", "lm_head")}
"""The children of torchtitan's llama3 and qwen3 models by release (0.2.2 `Transformer` and `Qwen3Model`, 0.3.0 their
`Decoder`); `layers` is a ModuleDict keyed "0", "1", ..."""

TORCHTITAN_FLAVORS = {
    ("llama3", "8B"): dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim_multiplier=1.3, multiple_of=1024),
    ("llama3", "70B"): dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3, multiple_of=4096),
    ("llama3", "405B"): dict(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim_multiplier=1.2,
                             multiple_of=4096),
    ("qwen3", "0.6B"): dict(dim=1024, n_layers=28, n_heads=16, hidden_dim=3072, enable_weight_tying=True),
    ("qwen3", "1.7B"): dict(dim=2048, n_layers=28, n_heads=16, hidden_dim=6144, enable_weight_tying=True),
    ("qwen3", "4B"): dict(dim=2560, n_layers=36, n_heads=32, hidden_dim=9728, enable_weight_tying=True),
    ("qwen3", "8B"): dict(dim=4096, n_layers=36, n_heads=32, hidden_dim=12288),
    ("qwen3", "14B"): dict(dim=5120, n_layers=40, n_heads=40, hidden_dim=17408),
    ("qwen3", "32B"): dict(dim=5120, n_layers=64, n_heads=64, hidden_dim=25600),
    ("qwen3", "30B-A3B"): dict(dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, hidden_dim=6144, moe_enabled=True,
                               moe_inter_dim=768, num_experts=128, top_k=8, num_shared_experts=0),
    ("qwen3", "235B-A22B"): dict(dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, hidden_dim=12288,
                                 rope_theta=5000000, moe_enabled=True, moe_inter_dim=1536, num_experts=128, top_k=8,
                                 num_shared_experts=0),
}
"""The flavors' arguments as 0.2.2's `llama3_args` and `qwen3_args` give them, MoEArgs flattened (0.3.0's
`llama3_configs` and `qwen3_configs` build the same figures); the rest are their defaults (`TORCHTITAN_DEFAULTS`)."""

TORCHTITAN_DEFAULTS = {"llama3": dict(vocab_size=128256, rope_theta=500000, n_kv_heads=None, ffn_dim_multiplier=None,
                                      multiple_of=256, enable_weight_tying=False),
                       "qwen3": dict(vocab_size=151936, rope_theta=1000000, n_kv_heads=8, head_dim=128,
                                     enable_weight_tying=False, moe_enabled=False)}
"""Every llama3 flavor sets rope_theta 500000 (TransformerModelArgs' default is 10000); Qwen3ModelArgs' defaults."""

TORCHTITAN_RECIPES = {"llama3_8b": ("llama3", "8B"), "llama3_70b": ("llama3", "70B"),
                      "llama3_405b": ("llama3", "405B"), "qwen3_0_6b": ("qwen3", "0.6B"),
                      "qwen3_1_7b": ("qwen3", "1.7B"), "qwen3_14b": ("qwen3", "14B"), "qwen3_32b": ("qwen3", "32B"),
                      "qwen3_30b_a3b": ("qwen3", "30B-A3B")}
"""0.3.0's config registry entries for those flavors (`model_registry(FLAVOR)` in each)."""


def torchtitan_built(model: str, flavor: str) -> dict:
    """What torchtitan builds for a flavor, in ModelConfig terms, and its RoPE. llama3's FeedForward widens
    4·dim to multiple_of · ceil(ffn_dim_multiplier · int(2 · 4·dim / 3) / multiple_of), its head_dim is
    dim // n_heads, and its RoPE always applies Llama 3.1's scaling (0.2.2 `precompute_freqs_cis` with the
    default RoPEScalingArgs, 0.3.0 `ComplexRoPE(scaling="llama")`); qwen3 gives hidden_dim and head_dim and
    does not scale; a qwen3 MoE flavor makes every block MoE, so its hidden_dim builds nothing (ffn 0)."""
    args = {**TORCHTITAN_DEFAULTS[model], **TORCHTITAN_FLAVORS[model, flavor]}
    if model == "llama3":
        ffn = int(2 * 4 * args["dim"] / 3)
        if args["ffn_dim_multiplier"] is not None:
            ffn = int(args["ffn_dim_multiplier"] * ffn)
        ffn = args["multiple_of"] * math.ceil(ffn / args["multiple_of"])
        head_dim, scaling = args["dim"] // args["n_heads"], True
    else:
        ffn, head_dim, scaling = 0 if args["moe_enabled"] else args["hidden_dim"], args["head_dim"], False
    experts = (args["num_experts"], args["top_k"], args["moe_inter_dim"]) if args.get("moe_enabled") else (0, 0, 0)
    return {"layers": args["n_layers"], "hidden": args["dim"], "heads": args["n_heads"],
            "kv_heads": args["n_kv_heads"] or args["n_heads"], "ffn": ffn, "vocab": args["vocab_size"],
            "head_dim": head_dim, "tied": args["enable_weight_tying"], "rope": Rope(args["rope_theta"], scaling),
            "experts": experts, "shared_experts": args.get("num_shared_experts", 0)}


def torchtitan_split(parts: list[list[str]], release: str) -> tuple[int, ...]:
    """Blocks per model part as torchtitan's `_split_module` keeps them, after what a pipeline needs of the names:
    `_split_module` drops a name that is no child of the release's model without a word, so a stage meant to hold
    the output layer under the other release's name has none (0.3.0's trainer then asserts "Last PP stage must
    have lm_head"). Every block once and in order, the embedding first, norm and output layer last."""
    embedding, layers, norm, head = TORCHTITAN_MODULES[release]
    names = [name for part in parts for name in part]
    strangers = [n for n in names if n not in (embedding, norm, head) and not (n.startswith(f"{layers}.") and
                                                                             n.split(".", 1)[1].isdigit())]
    if strangers:
        raise UniapError(f"torchtitan {release}: {', '.join(strangers)} name no module of its model")
    blocks = [int(n.split(".", 1)[1]) for n in names if n.startswith(f"{layers}.")]
    if blocks != list(range(len(blocks))):
        raise UniapError(f"torchtitan {release}: the parts hold blocks {blocks}, not each block once in order")
    if embedding not in parts[0] or names.count(embedding) != 1:
        raise UniapError(f"torchtitan {release}: {embedding} must be on the first part only")
    if not {norm, head} <= set(parts[-1]) or names.count(norm) + names.count(head) != 2:
        raise UniapError(f"torchtitan {release}: the last part must hold {norm} and {head}")
    return tuple(sum(n.startswith(f"{layers}.") for n in part) for part in parts)


def torchtitan_0_3_command(text: str) -> tuple[str, str, list[str]]:
    """The module, the config registry entry and the overrides of the header's torchtitan 0.3.0 command line."""
    line = next((line for line in text.splitlines() if line.startswith("#   torchtitan 0.3.0:")), None)
    if line is None:
        raise UniapError("torchtitan config: no torchtitan 0.3.0 command line in the header")
    words = shlex.split(line.split(":", 1)[1])
    try:
        module, recipe = words[words.index("--module") + 1], words[words.index("--config") + 1]
    except (ValueError, IndexError):
        raise UniapError("torchtitan 0.3.0 command line: --module and --config missing") from None
    return module, recipe, words[words.index("--config") + 2:]


def torchtitan_0_3_parts(overrides: list[str]) -> list[list[str]]:
    """`--parallelism.module_fqns_per_model_part` of 0.3.0 overrides: one comma-separated word per model part."""
    key = "--parallelism.module_fqns_per_model_part"
    if key not in overrides:
        raise UniapError(f"torchtitan 0.3.0 command line: {key} missing")
    start = overrides.index(key) + 1
    words = overrides[start:]
    end = next((i for i, w in enumerate(words) if w.startswith("--") or ":" in w), len(words))
    return [word.split(",") for word in words[:end]]


def read_torchtitan(text: str) -> dict:
    """The settings a torchtitan TOML carries (`settings_of`), after checking it against `TORCHTITAN_SCHEMA`."""
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UniapError(f"not a TOML file: {exc}") from None
    for section, values in config.items():
        if section not in TORCHTITAN_SCHEMA or not isinstance(values, dict):
            raise UniapError(f"torchtitan config: unknown section [{section}]")
        _check_torchtitan_table((section,), values, TORCHTITAN_SCHEMA[section])
    try:
        training, par = config["training"], config["parallelism"]
        replicate, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
        tp, cp = par["tensor_parallel_degree"], par.get("context_parallel_degree", 1)
        pp, parts = par["pipeline_parallel_degree"], par["module_fqns_per_model_part"]
        dp = replicate * shard
        if training["seq_len"] % (tp * 2 * cp):
            raise UniapError(f"torchtitan: Sequence length {training['seq_len']} must be divisible by the product of "
                             f"TP degree ({tp}) and 2 * CP degree ({cp}).")
        fsdp = shard * cp > 1  # ParallelDims.fsdp_enabled: dp_shard or cp
        if fsdp and replicate > 1:
            raise UniapError("torchtitan config: dp_replicate with FSDP is HSDP, not a ZeRO stage over dp · cp")
        local = training["local_batch_size"]
        accumulation = training["global_batch_size"] // (local * dp)
        micro_size = par["pipeline_parallel_microbatch_size"] if pp > 1 else local
        reshard = {"always": 3, "never": 2, "default": 2 if pp > 1 else 3}  # "default": no resharding with pp
        zero = reshard[par["fsdp_reshard_after_forward"]] if fsdp else 0
        schedule = {name: ours for ours, name in torchtitan.SCHEDULES.items()}[par["pipeline_parallel_schedule"]]
        precision = {"bfloat16": "bf16", "float32": "fp32"}[training["mixed_precision_param"]]
        converters = config["model"].get("converters", [])
        unknown = [name for name in converters if name not in TORCHTITAN_CONVERTERS]
        if unknown:
            raise UniapError(f"torchtitan config: model converter {unknown[0]!r} is not registered")
        if "quantize.linear.float8" in converters:
            if precision != "bf16":
                raise UniapError("torchtitan config: float8 here is bf16 mixed precision with float8 GEMMs")
            precision = "fp8"
        return {"tp": tp, "dp": dp, "pp": pp, "cp": cp, "zero": zero, "sp": tp > 1,
                "recompute": _torchtitan_recompute(config.get("activation_checkpoint", {})),
                "global_batch": training["global_batch_size"], "micro_batches": accumulation * (local // micro_size),
                "micro_batch_size": micro_size, "precision": precision,
                "schedule": schedule if pp > 1 else None, "virtual_stages": len(parts) // pp,
                "chunk_blocks": torchtitan_split(parts, "0.2.2")}
    except (KeyError, ZeroDivisionError) as exc:
        raise UniapError(f"torchtitan config lacks or mis-sets {exc}") from None


def _torchtitan_recompute(table: dict) -> str:
    """The recompute level of `[activation_checkpoint]` (0.2.2's default mode is "selective", with option "2": full
    checkpointing of every second layer): "op" is per-op selective checkpointing, the plan's "selective-op"."""
    mode = table.get("mode", "selective")
    if mode == "selective":
        option = table.get("selective_ac_option", "2")
        if option != "op":
            if not option.isdigit():
                raise UniapError(f"torchtitan config: selective_ac_option must be 'op' or an int, not {option!r}")
            raise UniapError(f"torchtitan config: selective_ac_option {option} recomputes every {option}th layer "
                             "whole, not a level for all blocks")
        return "selective-op"
    if mode not in ("full", "none"):
        raise UniapError(f"torchtitan config: activation_checkpoint mode {mode} is no recompute level")
    return mode


DEEPSPEED_SCHEMA = {"train_batch_size": int, "train_micro_batch_size_per_gpu": int,
                    "gradient_accumulation_steps": int, "bf16": dict, "fp16": dict, "zero_optimization": dict,
                    "pipeline": dict, "activation_checkpointing": dict}
"""The top-level keys written and their JSON types, as DeepSpeed 0.19.8's config reads them."""


def read_deepspeed(text: str, world: int, blocks: int) -> dict:
    """The settings a DeepSpeed config carries for a job on `world` devices of a model with `blocks` blocks
    (DeepSpeed takes the device count from the launcher and the blocks from the model code; the split is the
    even one its balanced partition makes)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UniapError(f"not a JSON file: {exc}") from None
    for key, value in config.items():
        kind = DEEPSPEED_SCHEMA.get(key)
        if kind is None or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UniapError(f"DeepSpeed config: {key} = {value!r} is not a known {kind.__name__ if kind else 'key'}")
    try:
        pipeline = config.get("pipeline", {})
        pp = int(pipeline.get("stages", 1))
        dp = world // pp
        micro, accumulation = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
        zero = int(config.get("zero_optimization", {}).get("stage", 0))
        batch = config["train_batch_size"]
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise UniapError(f"DeepSpeed config lacks or mis-sets {exc}") from None
    if batch != micro * accumulation * dp:
        raise UniapError("DeepSpeed config: train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step "
                         "* world_size")
    if pp > 1 and zero > 1:
        raise UniapError("DeepSpeed config: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    precision = "bf16" if config.get("bf16", {}).get("enabled") else \
        "fp16" if config.get("fp16", {}).get("enabled") else "fp32"
    recompute = pipeline.get("activation_checkpoint_interval", 0) > 0 if pp > 1 else \
        "activation_checkpointing" in config
    return {"tp": 1, "dp": dp, "pp": pp, "cp": 1, "zero": zero, "sp": False,
            "recompute": "full" if recompute else "none",
            "global_batch": batch, "micro_batches": accumulation, "micro_batch_size": micro,
            "precision": precision, "schedule": "1f1b" if pp > 1 else None, "virtual_stages": 1,
            "chunk_blocks": (blocks // pp,) * pp}
