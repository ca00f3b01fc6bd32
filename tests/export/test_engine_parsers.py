"""The exported files read by the engines' own config code, and the models they build from them, where the
engines install (a test-only extra, checked with torchtitan 0.2.2 and 0.3.0 (one at a time: the tests pick by
version) and DeepSpeed 0.19.8 in a private venv); skipped when they are missing. test_export.py and
test_engine_builds.py check the same files against our readers of the engines always. Megatron-LM's training code
is no package: with MEGATRON_LM set to a checkout (d98e8a6 checked), its arguments.py reads the launch scripts
(megatron_arguments.py)."""

import dataclasses
import importlib
import json
import os
import shlex
import subprocess
import sys

import pytest

from uniap.export import export_plan
from uniap.export.capability import Rope, job_of
from uniap.export.torchtitan import MODELS, flavor_of
from uniap.strategies import Strategy as S

from engine_readers import TORCHTITAN_MODULES, torchtitan_0_3_command, torchtitan_built
from export_plans import uniform_plan
from test_engine_builds import model_source


def torchtitan_manager(line: str):
    """torchtitan's ConfigManager of the release `line` ("0.2", "0.3"), or skip."""
    torchtitan = pytest.importorskip("torchtitan")
    if not torchtitan.__version__.startswith(line):
        pytest.skip(f"torchtitan {torchtitan.__version__} installed, this checks {line}.x")
    return pytest.importorskip("torchtitan.config.manager")


INTERLEAVED_TP = dict(strategy=S(2, 2, 2, True, True), chunk_blocks=(1, 1, 1, 1), micro_batches=4,
                      schedule="interleaved-1f1b", virtual_stages=2)


def test_torchtitan_0_2_config_manager_reads_the_toml(tmp_path):
    manager = torchtitan_manager("0.2")
    plan = uniform_plan(**INTERLEAVED_TP)
    path = tmp_path / "job.toml"
    path.write_text(export_plan(plan, "torchtitan"))
    config = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.data_parallel_shard_degree) == (2, 2, 2)
    assert par.data_parallel_replicate_degree == 1 and par.fsdp_reshard_after_forward == "never"
    assert par.pipeline_parallel_schedule == "Interleaved1F1B" and par.pipeline_parallel_microbatch_size == 4
    assert par.module_fqns_per_model_part == [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"],
                                              ["layers.3", "norm", "output"]]
    assert config.training.local_batch_size == 16 and config.training.global_batch_size == 32
    assert config.activation_checkpoint.mode == "full" and config.training.mixed_precision_param == "bfloat16"


def test_torchtitan_0_3_config_manager_reads_the_header_command_line():
    manager = torchtitan_manager("0.3")
    text = export_plan(uniform_plan(**INTERLEAVED_TP), "torchtitan")
    line = next(line for line in text.splitlines() if line.startswith("#   torchtitan 0.3.0:"))
    words = shlex.split(line)
    args = words[words.index("--config") + 2:]  # after the recipe: the plan's overrides
    config = manager.ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *args])
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.data_parallel_shard_degree) == (2, 2, 2)
    assert par.fsdp_reshard_after_forward == "never" and par.pipeline_parallel_schedule == "Interleaved1F1B"
    assert par.module_fqns_per_model_part == [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"],
                                              ["layers.3", "norm", "lm_head"]]
    assert (config.training.local_batch_size, config.training.global_batch_size) == (16, 32)
    assert type(config.activation_checkpoint).__qualname__ == "FullAC.Config"


BUILT = [  # model (zoo name or a config.json of test_engine_builds), strategy, blocks per chunk, schedule, v
    ("llama3-8b", S(2, 1, 3), (4,) * 8, "interleaved-1f1b", 2),
    ("qwen3-0.6b", S(8, 1, 3), (28,), "1f1b", 1),
    ("qwen3-8b", S(4, 1, 3), (18, 18), "1f1b", 1),
]


def built_plan(tmp_path, model, strategy, chunks, schedule, v):
    return uniform_plan(model_source(tmp_path, model), strategy=strategy, chunk_blocks=chunks, micro_batches=8,
                        global_batch=64, schedule=schedule, virtual_stages=v)


def assert_builds(plan, model, flavor, rope, release):
    """torchtitan's model of the export: the modules the release names, the plan's parameters, the flavor's RoPE."""
    assert tuple(name for name, _ in model.named_children()) == TORCHTITAN_MODULES[release]
    assert sum(p.numel() for p in model.parameters()) == plan.model.parameters
    assert rope == torchtitan_built(MODELS[plan.model_config().family].name, flavor)["rope"]


@pytest.mark.parametrize("model_name,strategy,chunks,schedule,v", BUILT)
def test_torchtitan_0_2_builds_the_exported_model(tmp_path, model_name, strategy, chunks, schedule, v):
    manager = torchtitan_manager("0.2")
    import torch
    from torchtitan.protocols.train_spec import get_train_spec

    plan = built_plan(tmp_path, model_name, strategy, chunks, schedule, v)
    path = tmp_path / "job.toml"
    path.write_text(export_plan(plan, "torchtitan"))
    config = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    spec = get_train_spec(config.model.name)
    if len(chunks) > 1 and config.model.name == "qwen3":
        assert spec.pipelining_fn is None  # what the header says: run it with 0.3.0
    args = spec.model_args[config.model.flavor]
    with torch.device("meta"):
        model = spec.model_cls(args)
    llama = config.model.name == "llama3"  # llama3's precompute_freqs_cis always scales as Llama 3.1 does
    assert_builds(plan, model, config.model.flavor, Rope(args.rope_theta, llama), "0.2.2")
    for part, count in zip(config.parallelism.module_fqns_per_model_part, chunks):
        for name in part:
            model.get_submodule(name)  # what pipeline_module_split keeps of the stage: every name a module
        assert sum(name.startswith("layers.") for name in part) == count


@pytest.mark.parametrize("model_name,strategy,chunks,schedule,v", BUILT)
def test_torchtitan_0_3_builds_the_exported_model(tmp_path, model_name, strategy, chunks, schedule, v):
    manager = torchtitan_manager("0.3")
    import torch
    from torchtitan.distributed.pipeline_parallel import _split_module

    plan = built_plan(tmp_path, model_name, strategy, chunks, schedule, v)
    module, recipe, overrides = torchtitan_0_3_command(export_plan(plan, "torchtitan"))
    given = {"qwen3": "qwen3_14b"}[module] if recipe == "RECIPE" else recipe  # RECIPE: any entry, its model ours
    config = manager.ConfigManager().parse_args(["--module", module, "--config", given, *overrides])
    spec = config.model_spec if recipe != "RECIPE" else \
        importlib.import_module(f"torchtitan.models.{module}").model_registry(flavor_of(plan.model_config()).name)
    with torch.device("meta"):
        model = spec.model.build()
    rope = spec.model.layers[0].attention.rope
    assert_builds(plan, model, spec.flavor, Rope(rope.theta, rope.scaling == "llama"), "0.3.0")
    parts = config.parallelism.module_fqns_per_model_part
    stages = [_split_module(model, part) for part in parts]  # as pipeline_module_split builds each stage
    assert [len(stage.layers) for stage in stages] == list(chunks)
    assert stages[0].tok_embeddings is not None and stages[-1].lm_head is not None and stages[-1].norm is not None
    assert all(stage.lm_head is None for stage in stages[:-1])


class DataParallel:
    """The one thing DeepSpeedConfig asks of an mpu: the data-parallel world size."""

    def __init__(self, size):
        self.size = size

    def get_data_parallel_world_size(self):
        return self.size


@pytest.mark.parametrize("model,strategy,chunks,precision", [("tiny-llama", S(8, 1, 3, True), (4,), "bf16"),
                                                           ("tiny-llama", S(4, 1, 1, True), (2, 2), "bf16"),
                                                           ("tiny-llama", S(2, 1, 0), (1, 1, 1, 1), "fp16"),
                                                           ("qwen3-0.6b", S(4, 1, 1), (14, 14), "bf16")])  # any family
def test_deepspeed_config_parser_reads_the_json(tmp_path, model, strategy, chunks, precision, monkeypatch):
    config_mod = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(config_mod.dist, "get_rank", lambda: 0)  # no process group here; the mpu gives the size
    utils = pytest.importorskip("deepspeed.runtime.utils")

    plan = uniform_plan(model_source(tmp_path, model), strategy=strategy, chunk_blocks=chunks, micro_batches=4,
                        precision=precision)
    job = job_of(plan)
    text = export_plan(plan, "deepspeed")
    config = config_mod.DeepSpeedConfig(json.loads(text), mpu=DataParallel(job.dp))
    assert config.train_batch_size == 32 and config.gradient_accumulation_steps == 4
    assert config.train_micro_batch_size_per_gpu == 32 // (4 * job.dp)
    assert config.zero_optimization_stage == strategy.zero
    assert (config.bfloat16_config.enabled, config.float16_config.enabled) == (precision == "bf16", precision == "fp16")
    if job.pp > 1:
        assert config.pipeline["stages"] == job.pp
        assert config.pipeline["activation_checkpoint_interval"] == int(strategy.recompute == "full")
        # PipelineModule's "type:" partition balances the blocks: our even split, embedding first, head last
        bounds = [int(b) for b in utils.partition_balanced([0] + [1] * job.blocks + [0], job.pp)]
        assert [sum(1 <= u <= job.blocks for u in range(a, b)) for a, b in zip(bounds, bounds[1:])] == list(chunks)


LEVELS_TOML = dict(strategy=S(1, 2, 3, "selective-op", True, cp=2), chunk_blocks=(2, 2), micro_batches=4,
                   precision="fp8")  # on H100s: fp8 needs SM89


def test_torchtitan_0_2_reads_selective_cp_and_fp8(tmp_path):
    manager = torchtitan_manager("0.2")
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.protocols.model_converter import _registry_model_converter_cls

    plan = uniform_plan(cluster="h100-80g:1x8", **LEVELS_TOML)
    path = tmp_path / "job.toml"
    path.write_text(export_plan(plan, "torchtitan"))
    config = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    ac, par = config.activation_checkpoint, config.parallelism
    assert (ac.mode, ac.selective_ac_option) == ("selective", "op")  # per-op SAC
    assert par.context_parallel_degree == 2 and par.context_parallel_load_balancer == "headtail"
    assert config.model.converters == ["quantize.linear.float8"]
    assert set(config.model.converters) <= set(_registry_model_converter_cls)  # what ModelConvertersContainer looks up
    assert "float8" not in _registry_model_converter_cls  # the name of its older docs is gone
    assert config.quantize.linear.float8.filter_fqns == ["output"] and config.quantize.linear.float8.recipe_name is None
    assert config.training.mixed_precision_param == "bfloat16"
    dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree, dp_shard=par.data_parallel_shard_degree,
                        cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                        ep=par.expert_parallel_degree, etp=par.expert_tensor_parallel_degree, world_size=plan.world_size)
    assert dims.fsdp_enabled and config.training.seq_len % dims.seq_len_divisor == 0  # as parallelize_llama asserts


def test_torchtitan_0_2_reads_the_float8_experts(tmp_path):
    manager = torchtitan_manager("0.2")
    from torchtitan.protocols.model_converter import _registry_model_converter_cls

    from test_export_moe import QWEN3_MOE, moe_plan

    plan = moe_plan(QWEN3_MOE, S(8, 1, 3, ep=8), cluster="h100-80g:1x8")
    path = tmp_path / "job.toml"
    path.write_text(export_plan(dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, precision="fp8")), "torchtitan"))
    config = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    assert config.model.converters == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert set(config.model.converters) <= set(_registry_model_converter_cls)
    assert config.quantize.grouped_mm.float8.fqns == ["experts"]
    assert config.quantize.linear.float8.filter_fqns == ["output", "router.gate"]
    assert config.parallelism.expert_parallel_degree == 8


def test_torchtitan_0_3_reads_selective_and_cp_from_the_command_line():
    manager = torchtitan_manager("0.3")
    text = export_plan(uniform_plan(cluster="h100-80g:1x8", **LEVELS_TOML), "torchtitan")
    _, _, overrides = torchtitan_0_3_command(text)
    config = manager.ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *overrides])
    assert type(config.activation_checkpoint).__qualname__ == "SelectiveAC.Config"
    assert config.parallelism.context_parallel_degree == 2 and config.parallelism.data_parallel_shard_degree == 1


MEGATRON_CASES = [  # strategy, chunks, precision: what Megatron-LM's own argument code makes of each export
    (S(2, 2, 1, "selective", True, cp=2), (4,), "fp8"),
    (S(1, 2, 1, "full", True, cp=2), (2, 2), "bf16"),
    (S(4, 1, 0, "none", cp=2), (4,), "bf16"),
    (S(4, 1, 1, "selective"), (1, 1, 1, 1), "bf16"),
]


def megatron_reads(tmp_path, text):
    """What megatron_arguments.py, run against the Megatron-LM checkout at $MEGATRON_LM, makes of a script."""
    checkout = os.environ.get("MEGATRON_LM")
    if not checkout or not os.path.isfile(os.path.join(checkout, "megatron", "training", "arguments.py")):
        pytest.skip("set MEGATRON_LM to a Megatron-LM checkout to read the flags with its arguments.py")
    script = tmp_path / "launch.sh"
    script.write_text(text)
    helper = os.path.join(os.path.dirname(__file__), "megatron_arguments.py")
    env = {**os.environ, "PYTHONPATH": checkout}
    out = subprocess.run([sys.executable, helper, str(script)], env=env, capture_output=True, text=True, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "unavailable" in result:
        pytest.skip(f"Megatron-LM does not import here: {result['unavailable']}")
    return result


@pytest.mark.parametrize("strategy,chunks,precision", MEGATRON_CASES)
def test_megatron_arguments_read_the_levels(tmp_path, strategy, chunks, precision):
    plan = uniform_plan(cluster="h100-80g:1x8", strategy=strategy, chunk_blocks=chunks, micro_batches=4,
                        precision=precision, schedule="interleaved-1f1b" if len(chunks) == 4 else "1f1b",
                        virtual_stages=2 if len(chunks) == 4 else 1)
    job = job_of(plan)
    got = megatron_reads(tmp_path, export_plan(plan, "megatron"))
    assert "error" not in got, got
    assert (got["world"], got["dp"], got["tp"], got["cp"], got["pp"]) == (job.world, job.dp, job.tp, job.cp, job.pp)
    assert got["recompute_granularity"] == {"none": None}.get(job.recompute, job.recompute)
    if job.recompute == "selective":
        assert got["recompute_modules"] == ["core_attn"] and got["recompute_method"] is None
    if job.recompute == "full":
        assert (got["recompute_method"], got["recompute_num_layers"]) == ("uniform", 1)
    assert got["fp8"] == ("hybrid" if precision == "fp8" else None) and got["bf16"]
    if precision == "fp8":
        assert (got["fp8_recipe"], got["fp8_amax_history_len"], got["fp8_amax_compute_algo"]) == \
            ("delayed", 1024, "max")
    assert got["distributed_optimizer"] == (job.zero == 1 and job.replicas > 1)


def test_megatron_arguments_require_the_environment_for_cp(tmp_path):
    plan = uniform_plan(strategy=S(4, 1, 0, cp=2), chunk_blocks=(4,))
    text = export_plan(plan, "megatron").replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", "")
    got = megatron_reads(tmp_path, text)
    assert "context parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS" in got["error"]


def test_torchtitan_0_3_recipes_convert_to_float8_as_listed(monkeypatch):
    torchtitan_manager("0.3")
    pytest.importorskip("torchao")
    float8 = pytest.importorskip("torchtitan.components.quantization.float8")
    from torchtitan.components.quantization.utils import has_quantization

    from uniap.export.torchtitan import FLAVORS, FLOAT8_RECIPES

    monkeypatch.setattr(float8, "has_cuda_capability", lambda *_: True)  # as on an H100: the converter converts
    for flavor in FLAVORS:
        if flavor.recipe:
            registry = importlib.import_module(f"torchtitan.models.{MODELS[flavor.family].name}.config_registry")
            spec = getattr(registry, flavor.recipe)().model_spec
            assert has_quantization(spec.model) == (flavor.recipe in FLOAT8_RECIPES), flavor.recipe
