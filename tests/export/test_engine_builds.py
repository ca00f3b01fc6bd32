"""What each engine builds from an export, by the engines' own facts (tests/export/engine_readers.py): torchtitan's
module names per release and the model its flavor builds, Megatron-LM's RoPE and launch environment. The same
checked by the installed engines themselves is tests/export/test_engine_parsers.py."""

import json
import os
import stat
import subprocess

import pytest

from uniap.errors import UniapError
from uniap.export import export_plan
from uniap.export.capability import Rope
from uniap.export.torchtitan import FLAVORS, MODELS
from uniap.strategies import Strategy as S

from engine_readers import (TORCHTITAN_RECIPES, megatron_arguments, megatron_environment, megatron_rope,
                            read_megatron, torchtitan_0_3_command, torchtitan_0_3_parts, torchtitan_built,
                            torchtitan_split)
from export_plans import uniform_plan

LLAMA_3_1_8B = {  # meta-llama/Llama-3.1-8B config.json (the fields read)
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
QWEN3 = {  # Qwen/Qwen3-0.6B and Qwen3-8B config.json (the fields read)
    "0.6B": {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
             "max_position_embeddings": 40960, "tie_word_embeddings": True, "rope_theta": 1000000,
             "use_sliding_window": False, "sliding_window": None, "attention_bias": False, "hidden_act": "silu"},
    "8B": {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
           "max_position_embeddings": 40960, "tie_word_embeddings": False, "rope_theta": 1000000,
           "use_sliding_window": False, "sliding_window": None, "attention_bias": False, "hidden_act": "silu"},
}
CONFIGS = {"llama-3.1-8b": LLAMA_3_1_8B, "qwen3-0.6b": QWEN3["0.6B"], "qwen3-8b": QWEN3["8B"]}


def config_path(tmp_path, name):
    folder = tmp_path / name  # a Hugging Face checkout: the folder names the model
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS[name]))
    return str(folder / "config.json")


def model_source(tmp_path, name):
    """A zoo name as it is, a name of `CONFIGS` as its config.json."""
    return config_path(tmp_path, name) if name in CONFIGS else name


def one_stage(model, blocks):
    return uniform_plan(model, strategy=S(8, 1, 3), chunk_blocks=(blocks,))


def toml_model(text):
    import tomllib

    return tomllib.loads(text)["model"]


def test_torchtitan_flavors_are_what_it_registers():
    for flavor in FLAVORS:
        model = MODELS[flavor.family].name
        built = torchtitan_built(model, flavor.name)
        assert (built["layers"], built["hidden"], built["heads"], built["kv_heads"], built["ffn"], built["vocab"],
                built["head_dim"], built["tied"]) == flavor.figures and built["rope"] == flavor.rope
        assert built["experts"] == flavor.experts and built["shared_experts"] == 0
        if flavor.recipe:
            assert TORCHTITAN_RECIPES[flavor.recipe] == (model, flavor.name)
    assert {flavor.recipe for flavor in FLAVORS if flavor.recipe} == set(TORCHTITAN_RECIPES)


@pytest.mark.parametrize("model,blocks,flavor,rope", [
    ("llama3-8b", 32, "8B", None),
    ("llama3-405b", 126, "405B", Rope(500000, True)),  # Llama 3.1 405B: the flavor's scaled RoPE
    ("llama-3.1-8b", 32, "8B", Rope(500000, True)),  # named as its checkout is: 0.2.2 has no flavor llama3.1-8b
    ("qwen3-0.6b", 28, "0.6B", Rope(1000000, False)),
    ("qwen3-8b", 36, "8B", Rope(1000000, False)),
])
def test_torchtitan_builds_the_planned_model(tmp_path, model, blocks, flavor, rope):
    plan = one_stage(model_source(tmp_path, model), blocks)
    config = plan.model_config()
    text = export_plan(plan, "torchtitan")
    table = toml_model(text)
    assert table == {"name": MODELS[config.family].name, "flavor": flavor}
    built = torchtitan_built(table["name"], table["flavor"])
    assert (built["layers"], built["hidden"], built["heads"], built["kv_heads"], built["ffn"], built["vocab"],
            built["head_dim"], built["tied"]) == (config.layers, config.hidden, config.heads, config.n_kv_heads,
                                                  config.ffn, config.vocab, config.head_dim, config.tied_embeddings)
    if rope:  # what the model's config.json says (the plan records no rope_theta)
        assert built["rope"] == rope
    module, recipe, _ = torchtitan_0_3_command(text)
    assert recipe == "RECIPE" or TORCHTITAN_RECIPES[recipe] == (module, flavor)


def test_torchtitan_says_where_the_flavor_rotates_otherwise():
    text = export_plan(one_stage("llama3-8b", 32), "torchtitan")
    assert "# flavor 8B: llama3 with the plan's sizes, RoPE base 500000 with Llama 3.1's frequency scaling." in text
    assert "# llama3-8b rotates with base 500000 without that scaling: torchtitan trains the flavor's positions." \
        in text
    assert "rotates with base" not in export_plan(one_stage("llama3-405b", 126), "torchtitan")


INTERLEAVED = dict(strategy=S(2, 2, 3, True, True), chunk_blocks=(1, 1, 1, 1), micro_batches=4,
                   schedule="interleaved-1f1b", virtual_stages=2)


def test_torchtitan_parts_name_each_releases_modules():
    text = export_plan(uniform_plan(**INTERLEAVED), "torchtitan")
    import tomllib

    toml_parts = tomllib.loads(text)["parallelism"]["module_fqns_per_model_part"]
    assert torchtitan_split(toml_parts, "0.2.2") == (1, 1, 1, 1)
    _, _, overrides = torchtitan_0_3_command(text)
    header_parts = torchtitan_0_3_parts(overrides)
    assert torchtitan_split(header_parts, "0.3.0") == (1, 1, 1, 1)
    assert header_parts[-1] == ["layers.3", "norm", "lm_head"]
    # the other release's names: 0.3.0's _split_module drops "output" and its last stage has no head
    with pytest.raises(UniapError, match="^torchtitan 0.3.0: output name no module of its model$"):
        torchtitan_split(toml_parts, "0.3.0")
    with pytest.raises(UniapError, match="^torchtitan 0.2.2: lm_head name no module"):
        torchtitan_split(header_parts, "0.2.2")


def test_torchtitan_qwen3_pipelines_with_0_3_only(tmp_path):
    plan = uniform_plan(config_path(tmp_path, "qwen3-8b"), strategy=S(4, 1, 3), chunk_blocks=(18, 18))
    text = export_plan(plan, "torchtitan")
    assert "# torchtitan 0.2.2's qwen3 has no pipeline (\"does not support pipelining\"): run this plan with 0.3.0's " \
           "command line." in text
    module, recipe, overrides = torchtitan_0_3_command(text)
    assert (module, recipe) == ("qwen3", "RECIPE")  # 0.3.0 registers qwen3 8B but has no recipe for it
    assert torchtitan_split(torchtitan_0_3_parts(overrides), "0.3.0") == (18, 18)
    assert "0.3.0 has no config registry entry for qwen3 8B" in text


def test_torchtitan_zero_2_says_what_it_runs():
    text = export_plan(uniform_plan(strategy=S(8, 1, 2), chunk_blocks=(4,), micro_batches=4), "torchtitan")
    assert "# backward: each of the 4 micro-batches gathers the parameters again" in text
    assert "where the plan priced one gather per iteration" in text
    piped = export_plan(uniform_plan(strategy=S(4, 1, 2), chunk_blocks=(2, 2), micro_batches=4), "torchtitan")
    assert "each rank holds its stage's whole gradients, which\n# the plan's ZeRO-2 shards" in piped
    assert "gathers the parameters again" not in piped
    assert "ZeRO" not in export_plan(uniform_plan(strategy=S(8, 1, 3), chunk_blocks=(4,)), "torchtitan")


@pytest.mark.parametrize("model,blocks,rope", [("llama3-8b", 32, Rope(500000, False)),
                                               ("llama3-405b", 126, Rope(500000, True)),
                                               ("llama2-7b", 32, Rope(10000, False)),
                                               ("tiny-llama", 4, Rope(10000, False))])
def test_megatron_rotates_as_the_model_does(model, blocks, rope):
    _, args = megatron_arguments(export_plan(uniform_plan(model, strategy=S(8, 1, 1), chunk_blocks=(blocks,)),
                                             "megatron"))
    assert args.position_embedding_type == "rope" and megatron_rope(args) == rope


def test_megatron_says_when_the_plan_does_not_know_the_rope(tmp_path):
    plan = uniform_plan(config_path(tmp_path, "llama-3.1-8b"), strategy=S(8, 1, 1), chunk_blocks=(32,))
    text = export_plan(plan, "megatron")
    _, args = megatron_arguments(text)
    assert megatron_rope(args) == Rope(10000, False)  # Megatron-LM's default, what it trains unless told
    assert "# The plan does not record this model's rope_theta or rope_scaling: Megatron-LM rotates with base\n" \
           "# 10000 unless given --rotary-base THETA (and --use-rope-scaling for rope_scaling of type llama3)." in text
    gpt = export_plan(uniform_plan("gpt2", strategy=S(8, 1, 1), chunk_blocks=(12,)), "megatron")
    assert "rope" not in gpt and megatron_rope(megatron_arguments(gpt)[1]) == Rope(10000, False)


def test_megatron_sets_the_environment_tensor_parallelism_needs(tmp_path):
    tp = export_plan(uniform_plan(strategy=S(2, 2, 1, False, True), chunk_blocks=(2, 2)), "megatron")
    assert megatron_environment(tp) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert read_megatron(tp)["tp"] == 2
    with pytest.raises(UniapError, match="require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1"):
        read_megatron(tp.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", ""))
    plain = export_plan(uniform_plan(strategy=S(4, 1, 1), chunk_blocks=(2, 2)), "megatron")
    assert megatron_environment(plain) == {}
    # what the launched torchrun sees, run by the shell: the variable and the flags as one argument list
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "torchrun"
    stub.write_text('#!/bin/sh\necho "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-unset}"\n'
                    'printf "%s\\n" "$@"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "run.sh"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    for text, value in ((tp, "1"), (plain, "unset")):
        script.write_text(text)
        out = subprocess.run(["sh", str(script), "--data-path", "x"], env=env, capture_output=True, text=True,
                             check=True).stdout.splitlines()
        assert out[0] == f"CUDA_DEVICE_MAX_CONNECTIONS={value}"
        assert out[-2:] == ["--data-path", "x"] and "--tensor-model-parallel-size" in out


def test_deepspeed_runs_any_family(tmp_path):
    plan = one_stage(config_path(tmp_path, "qwen3-0.6b"), 28)
    assert json.loads(export_plan(plan, "deepspeed"))["zero_optimization"] == {"stage": 3}
