"""Recompute levels, context parallelism and fp8 exported: each engine's file, read back with our schema of that
engine (engine_readers.py, from Megatron-LM's arguments.py and TransformerConfig, torchtitan 0.2.2's JobConfig and
ParallelDims, DeepSpeed 0.19.8's config), carries them; what an engine cannot configure is refused in one line.
The engines' own parsers read the same files in test_engine_parsers.py."""

import dataclasses
import re
import tomllib

import pytest

from uniap.errors import UniapError
from uniap.export import engine_rules, export_plan
from uniap.export.capability import job_of
from uniap.strategies import Strategy as S

from engine_readers import (megatron_arguments, megatron_environment, read_megatron, read_torchtitan,
                            settings_of, torchtitan_0_3_command)
from export_plans import uniform_plan
from test_export import read_back
from test_export_moe import QWEN3_MOE, moe_plan

H100 = "h100-80g:1x8"  # fp8 plans: an fp8-capable device


def plan_of(strategy, chunks=(4,), precision="bf16", micro_batches=4, schedule="1f1b", v=1, model="tiny-llama"):
    return uniform_plan(model, H100, strategy=strategy, chunk_blocks=chunks, micro_batches=micro_batches,
                        schedule=schedule, virtual_stages=v, precision=precision)


LEVELS = [  # engine, strategy, chunk blocks, schedule, virtual stages, precision
    ("megatron", S(8, 1, 1, "selective"), (4,), "1f1b", 1, "bf16"),
    ("megatron", S(2, 2, 1, "selective", True, cp=2), (4,), "1f1b", 1, "fp8"),
    ("megatron", S(2, 1, 0, "full", cp=2), (2, 2), "1f1b", 1, "bf16"),
    ("megatron", S(1, 2, 1, "none", True, cp=2), (1, 1, 1, 1), "interleaved-1f1b", 2, "fp8"),
    ("megatron", S(4, 2, 0, "full", True), (4,), "1f1b", 1, "fp8"),
    ("torchtitan", S(8, 1, 3, "selective-op"), (4,), "1f1b", 1, "bf16"),
    ("torchtitan", S(2, 2, 3, "selective-op", True, cp=2), (4,), "1f1b", 1, "fp8"),
    ("torchtitan", S(1, 2, 2, "full", True, cp=2), (2, 2), "1f1b", 1, "bf16"),
    ("torchtitan", S(2, 1, 3, "none", cp=2), (1, 1, 1, 1), "interleaved-1f1b", 2, "fp8"),
    ("torchtitan", S(8, 1, 0), (4,), "1f1b", 1, "fp8"),
    ("deepspeed", S(8, 1, 3, "full"), (4,), "1f1b", 1, "bf16"),
    ("deepspeed", S(4, 1, 1, "none"), (2, 2), "1f1b", 1, "bf16"),
]


@pytest.mark.parametrize("engine,strategy,chunks,schedule,v,precision", LEVELS)
def test_levels_round_trip(engine, strategy, chunks, schedule, v, precision):
    plan = plan_of(strategy, chunks, precision, schedule=schedule, v=v)
    job = job_of(plan)
    settings = read_back(engine, export_plan(plan, engine), job)
    assert settings == settings_of(job)
    assert (settings["recompute"], settings["cp"], settings["precision"]) == \
        (strategy.recompute, strategy.cp, precision)
    assert (settings["tp"], settings["dp"], settings["pp"]) == (strategy.tp, strategy.dp, len(plan.stages))
    assert settings["tp"] * settings["cp"] * settings["dp"] * settings["pp"] == plan.world_size


def test_megatron_flags_of_each_level():
    _, args = megatron_arguments(export_plan(plan_of(S(8, 1, 1, "selective")), "megatron"))
    assert args.recompute_granularity == "selective" and args.recompute_method is None
    assert args.recompute_num_layers is None and args.recompute_modules is None  # default ["core_attn"]
    _, args = megatron_arguments(export_plan(plan_of(S(8, 1, 1, "full")), "megatron"))
    assert (args.recompute_granularity, args.recompute_method, args.recompute_num_layers) == ("full", "uniform", 1)
    _, args = megatron_arguments(export_plan(plan_of(S(8, 1, 1, "none")), "megatron"))
    assert args.recompute_granularity is None


def test_megatron_context_parallel_keeps_the_world():
    text = export_plan(plan_of(S(2, 1, 1, cp=2), chunks=(2, 2)), "megatron")
    world, args = megatron_arguments(text)
    assert (world, args.context_parallel_size, args.tensor_model_parallel_size,
            args.pipeline_model_parallel_size) == (8, 2, 1, 2)
    assert read_megatron(text)["dp"] == 2  # 8 / (tp 1 · cp 2 · pp 2)
    assert "# data-parallel size = 8 / (tp 1 · cp 2 · pp 2) = 2;" in text
    assert args.use_distributed_optimizer and args.cp_comm_type == ["p2p"]  # ZeRO-1 over dp · cp, the ring
    # validate_args' CUDA_DEVICE_MAX_CONNECTIONS rule holds for cp as for tp
    assert megatron_environment(text) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    with pytest.raises(UniapError, match="context parallelism require setting the environment variable"):
        read_megatron(text.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", ""))
    assert "--context-parallel-size" not in export_plan(plan_of(S(8, 1, 1)), "megatron")


def test_megatron_fp8_is_bf16_with_transformer_engine_fp8():
    text = export_plan(plan_of(S(8, 1, 1), precision="fp8"), "megatron")
    _, args = megatron_arguments(text)
    assert args.bf16 and not args.fp16 and args.fp8 == "hybrid" and args.fp8_recipe == "delayed"
    assert (args.fp8_amax_history_len, args.fp8_amax_compute_algo) == (1024, "max")
    _, plain = megatron_arguments(export_plan(plan_of(S(8, 1, 1)), "megatron"))
    assert plain.fp8 is None and plain.bf16


def test_torchtitan_tables_of_each_level():
    toml = tomllib.loads(export_plan(plan_of(S(8, 1, 3, "selective-op")), "torchtitan"))
    assert toml["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert tomllib.loads(export_plan(plan_of(S(8, 1, 3, "full")), "torchtitan"))["activation_checkpoint"] == \
        {"mode": "full"}
    assert tomllib.loads(export_plan(plan_of(S(8, 1, 3)), "torchtitan"))["activation_checkpoint"] == {"mode": "none"}
    toml = tomllib.loads(export_plan(plan_of(S(2, 2, 3, "none", True, cp=2), precision="fp8"), "torchtitan"))
    par = toml["parallelism"]
    assert (par["context_parallel_degree"], par["data_parallel_shard_degree"], par["tensor_parallel_degree"]) == \
        (2, 2, 2)
    assert toml["model"]["converters"] == ["quantize.linear.float8"]
    assert toml["quantize"] == {"linear": {"float8": {"filter_fqns": ["output"]}}}  # the head stays bf16
    assert toml["training"]["mixed_precision_param"] == "bfloat16"
    assert "converters" not in tomllib.loads(export_plan(plan_of(S(8, 1, 3)), "torchtitan"))["model"]


def test_torchtitan_0_3_command_line_of_each_level():
    text = export_plan(plan_of(S(2, 2, 3, "selective-op", True, cp=2), precision="fp8"), "torchtitan")
    _, recipe, overrides = torchtitan_0_3_command(text)
    assert overrides[-1] == "activation-checkpoint:selective"
    assert overrides[overrides.index("--parallelism.context_parallel_degree") + 1] == "2"
    assert not any("float8" in word for word in overrides)  # 0.3.0 converts in the config registry entry
    assert "# fp8: 0.3.0 converts in the config registry entry, not on the command line: RECIPE's model_registry(" \
           "..., converters=[Float8LinearConverter.Config(filter_fqns=['lm_head'])])." in text
    assert "selective" not in export_plan(plan_of(S(8, 1, 3, "full")), "torchtitan").split("[job]")[0]


def test_torchtitan_0_3_recipe_converts_as_the_plan_does():
    full = dict(chunks=(126,), model="llama3-405b")
    _, recipe, _ = torchtitan_0_3_command(fp8 := export_plan(plan_of(S(8, 1, 3), precision="fp8", **full),
                                                             "torchtitan"))
    assert recipe == "llama3_405b" and "# fp8:" not in fp8  # its entry converts with filter_fqns ["lm_head"]
    text = export_plan(plan_of(S(8, 1, 3), **full), "torchtitan")
    assert torchtitan_0_3_command(text)[1] == "RECIPE"
    assert "# 0.3.0's llama3_405b converts the blocks to float8, which this plan does not: RECIPE is an entry that " \
           "builds llama3 405B without converters." in text
    text = export_plan(plan_of(S(8, 1, 3), precision="fp8", chunks=(32,), model="llama3-8b"), "torchtitan")
    assert torchtitan_0_3_command(text)[1] == "RECIPE"
    assert "# 0.3.0's llama3_8b does not convert to float8" in text


def test_torchtitan_fp8_moe_converts_the_experts():
    plan = moe_plan(QWEN3_MOE, S(8, 1, 3, ep=8), cluster=H100)
    plan = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, precision="fp8"))
    toml = tomllib.loads(text := export_plan(plan, "torchtitan"))
    assert toml["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert toml["quantize"] == {"linear": {"float8": {"filter_fqns": ["output", "router.gate"]}},
                                "grouped_mm": {"float8": {"fqns": ["experts"]}}}
    assert read_torchtitan(text)["precision"] == "fp8"
    piped = dataclasses.replace(moe_plan(QWEN3_MOE, S(4, 1, 3, ep=4), chunk_blocks=(2, 2), cluster=H100),
                                workload=dataclasses.replace(plan.workload, precision="fp8"))
    with pytest.raises(UniapError, match=r"^torchtitan cannot run this plan: its float8 MoE training "
                                         r"\(quantize.grouped_mm.float8, a prototype\) runs without pipeline"):
        export_plan(piped, "torchtitan")


REFUSED = [  # engine, strategy, chunks, precision, what the one line says
    ("deepspeed", S(8, 1, 3, "selective"), (4,), "bf16",
     "it has no selective recomputation (it recomputes none, full): its activation checkpointing recomputes whole "
     "layers"),
    ("deepspeed", S(8, 1, 3, "selective-op"), (4,), "bf16",
     "it has no selective-op recomputation (it recomputes none, full): its activation checkpointing recomputes "
     "whole layers"),
    ("deepspeed", S(4, 1, 3, cp=2), (4,), "bf16",
     "its configuration has no context parallelism (the plan has cp 2): its sequence parallelism (Ulysses"),
    ("deepspeed", S(8, 1, 3), (4,), "fp8",
     "it does not train in fp8 (bf16, fp16, fp32): its config has no fp8 section"),
    ("torchtitan", S(4, 1, 0, cp=2), (4,), "bf16", "its replicated data parallelism (ZeRO-0) cannot be combined with "
                                                   "tp, cp or pp"),
    ("torchtitan", S(1, 1, 0, cp=8), (4,), "bf16", "its replicated data parallelism (ZeRO-0) cannot be combined"),
    ("megatron", S(4, 1, 3, cp=2), (4,), "bf16", "it has no ZeRO-3"),
    ("torchtitan", S(4, 1, 1, cp=2), (4,), "bf16", "it has no ZeRO-1"),
    ("torchtitan", S(8, 1, 3, "selective"), (4,), "bf16",
     "it has no selective recomputation (it recomputes none, selective-op, full): its selective checkpointing is per "
     "op or every N-th layer"),
    ("megatron", S(8, 1, 1, "selective-op"), (4,), "bf16",
     "it has no selective-op recomputation (it recomputes none, selective, full): its selective recompute recomputes "
     "modules"),
]


@pytest.mark.parametrize("engine,strategy,chunks,precision,says", REFUSED)
def test_refusals_are_one_line(engine, strategy, chunks, precision, says):
    with pytest.raises(UniapError, match=f"^{engine} cannot run this plan: {re.escape(says)}") as info:
        export_plan(plan_of(strategy, chunks, precision), engine)
    assert "\n" not in str(info.value)


def test_sequences_split_as_each_engine_needs():
    plan = plan_of(S(2, 2, 1, "none", True, cp=2))
    short = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, seq_len=66))  # not a multiple of 2 · cp
    with pytest.raises(UniapError, match=r"^megatron cannot run this plan: its sequences of dp2·cp2·tp2sp·z1 must "
                                         r"be a multiple of 4 tokens \(the plan has 66\)$"):
        export_plan(short, "megatron")
    titan = plan_of(S(2, 2, 3, "none", True, cp=2))
    uneven = dataclasses.replace(titan, workload=dataclasses.replace(titan.workload, seq_len=68))  # 4 | 68, not tp · 2 · cp
    assert export_plan(dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, seq_len=68)), "megatron")
    with pytest.raises(UniapError, match=r"^torchtitan cannot run this plan: its sequences of dp2·cp2·tp2sp·z3 must "
                                         r"be a multiple of 8 tokens \(the plan has 68\)$"):
        export_plan(uneven, "torchtitan")
    # the engine search asks the same question of a strategy
    assert engine_rules("torchtitan").strategy_why_not(S(2, 2, 3, "none", True, cp=2), 1, 0, 68)
    assert engine_rules("torchtitan").strategy_why_not(S(2, 2, 3, "none", True, cp=2), 1, 0, 64) is None
    assert engine_rules("deepspeed").strategy_why_not(S(8, 1, 3, "selective"), 1)


def test_blocks_mixing_levels_or_cp_are_refused_naming_them():
    plan = plan_of(S(2, 2, 1, "full", True, cp=2))
    layers = list(plan.layers)
    layers[2] = dataclasses.replace(layers[2], strategy=S(2, 2, 1, "selective", True, cp=2))
    for engine in ("megatron", "torchtitan", "deepspeed"):
        with pytest.raises(UniapError, match=r"^layer 2 \(block.1\) runs dp2·cp2·tp2sp·z1·sel but block.0 runs "
                                             r"dp2·cp2·tp2sp·z1·rc: engines run one strategy over all blocks "
                                             r"\(recompute selective, not full\)$"):
            export_plan(dataclasses.replace(plan, layers=layers), engine)
    layers = list(plan.layers)
    layers[0] = dataclasses.replace(layers[0], strategy=S(4, 2, 1, "none", True))
    with pytest.raises(UniapError, match=r"^layer 0 \(embed\) runs dp4·tp2sp·z1 but the blocks run "
                                         r"dp2·cp2·tp2sp·z1·rc: engines give it the blocks' strategy "
                                         r"\(dp2·cp2·tp2sp·z1\) \(cp 1, not 2\)$"):
        export_plan(dataclasses.replace(plan, layers=layers), "megatron")


def test_readers_hold_the_engines_rules_for_the_levels():
    text = export_plan(plan_of(S(8, 1, 1, "selective")), "megatron")
    with pytest.raises(UniapError, match="recompute method is not yet supported for selective"):
        read_megatron(text.replace("--recompute-granularity selective", "--recompute-granularity selective "
                                   "--recompute-method uniform"))
    with pytest.raises(UniapError, match="full recompute_num_layers must be between 1"):
        read_megatron(text.replace("--recompute-granularity selective", "--recompute-granularity full"))
    with pytest.raises(UniapError, match="--fp8-format: invalid choice"):
        read_megatron(text.replace("--bf16", "--bf16 --fp8-format e5m2"))
    cp = export_plan(plan_of(S(2, 2, 1, "none", True, cp=2)), "megatron")
    with pytest.raises(UniapError, match="seq-length should be a multiple of 2 \\* context-parallel-size"):
        read_megatron(cp.replace("--seq-length 64", "--seq-length 66"))
    toml = export_plan(plan_of(S(8, 1, 3, "selective-op"), precision="fp8"), "torchtitan")
    with pytest.raises(UniapError, match="model converter 'float8' is not registered"):
        read_torchtitan(toml.replace('converters = ["quantize.linear.float8"]', 'converters = ["float8"]'))
    with pytest.raises(UniapError, match="selective_ac_option 2 recomputes every 2th layer whole"):
        read_torchtitan(toml.replace('selective_ac_option = "op"', 'selective_ac_option = "2"'))
    with pytest.raises(UniapError, match=r"\[quantize.linear.float8\] filter_fqn = .* is not a known key"):
        read_torchtitan(toml.replace("filter_fqns =", "filter_fqn ="))
    with pytest.raises(UniapError, match="must be divisible by the product of TP degree"):
        read_torchtitan(toml.replace("seq_len = 64", "seq_len = 63"))
