"""The engines build the model the plan priced, or the export (and `plan --engine`) refuses it in one line naming
the feature: biases, tied embeddings, head width, norms, dropout."""

import json
import re
from dataclasses import replace

import pytest

from uniap.engine_search import engine_plan_search
from uniap.errors import UniapError
from uniap.export import engine_rules, export_plan
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload
from uniap.strategies import Strategy as S

from engine_readers import megatron_arguments
from export_plans import uniform_plan

LLAMA_3_2_1B = {  # meta-llama/Llama-3.2-1B config.json (the fields read)
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "max_position_embeddings": 131072, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
    "hidden_act": "silu", "rope_scaling": {"original_max_position_embeddings": 8192}}
TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
              "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 64}


def config_file(tmp_path, name, **fields):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(fields))
    return str(path)


def plan_of(model, blocks=4):
    """dp8 without ZeRO on one stage: a strategy every engine runs, so what is refused is the model."""
    return uniform_plan(model, strategy=S(8, 1, 0), chunk_blocks=(blocks,))


def refused(plan, engine, says):
    with pytest.raises(UniapError, match=f"^{engine} cannot run this plan: .*{re.escape(says)}") as info:
        export_plan(plan, engine)
    assert "\n" not in str(info.value)


def test_llama_attention_biases_are_refused_not_dropped(tmp_path):
    plan = plan_of(config_file(tmp_path, "biased", **TINY_LLAMA, attention_bias=True))
    refused(plan, "megatron", "biases on all, none or only the q/k/v projections (the model has q/k/v on, "
                              "output on, MLP off)")
    refused(plan, "torchtitan", "its llama3 has no biases (the model has q/k/v, attention output biases)")
    json.loads(export_plan(plan, "deepspeed"))  # DeepSpeed trains the user's own model code


def test_megatron_flags_carry_the_biases_the_model_has():
    base = load_model("tiny-llama").config
    _, none = megatron_arguments(export_plan(plan_of(base), "megatron"))
    assert none.disable_bias_linear and not none.add_qkv_bias
    _, qkv = megatron_arguments(export_plan(plan_of(replace(base, qkv_bias=True)), "megatron"))
    assert qkv.disable_bias_linear and qkv.add_qkv_bias  # Qwen2-style: biases on q/k/v only
    _, every = megatron_arguments(export_plan(plan_of("tiny-gpt"), "megatron"))
    assert not every.disable_bias_linear and not every.add_qkv_bias
    refused(plan_of(replace(base, mlp_bias=True)), "megatron", "q/k/v off, output off, MLP on")


def test_tied_llama_3_2_is_refused_by_torchtitan_and_tied_in_megatron(tmp_path):
    path = config_file(tmp_path, "llama-3.2-1b", **LLAMA_3_2_1B)
    spec = load_model(path)
    assert spec.tied_params == 128256 * 2048  # the ~262 M parameters an untied model would add
    plan = plan_of(path, blocks=16)
    refused(plan, "torchtitan", "its llama3 does not tie the output layer to the embedding")
    _, args = megatron_arguments(export_plan(plan, "megatron"))
    assert not args.untie_embeddings_and_output_weights and args.kv_channels is None
    assert (args.num_query_groups, args.normalization, args.position_embedding_type) == (8, "RMSNorm", "rope")
    assert args.swiglu and args.group_query_attention


def test_separate_head_width():
    wide = replace(load_model("tiny-llama").config, kv_channels=64)
    refused(plan_of(wide), "torchtitan", "no separate head_dim (the model's is 64")
    _, args = megatron_arguments(export_plan(plan_of(wide), "megatron"))
    assert args.kv_channels == 64


def test_megatron_dropout_is_the_models():
    _, llama = megatron_arguments(export_plan(plan_of("tiny-llama"), "megatron"))
    assert (llama.attention_dropout, llama.hidden_dropout) == (0.0, 0.0)
    _, gpt = megatron_arguments(export_plan(plan_of("tiny-gpt"), "megatron"))
    assert (gpt.attention_dropout, gpt.hidden_dropout) == (0.1, 0.1)  # Megatron's default, GPT-2's dropout
    refused(plan_of(replace(load_model("tiny-llama").config, dropout=True)), "torchtitan", "no dropout")


LAYOUTS = [  # fields of a llama config, what Megatron-LM's one line says
    ({"parallel_residual": True}, "no parallel residual"),
    ({"block_norms": "sandwich"}, "pre-norms only (the model has sandwich norms)"),
    ({"sliding_window": 16, "sliding_layers": (0, 2)}, "no sliding-window attention (the model has a 16-key"),
    ({"logit_softcap": 30.0}, "logits have no soft-capping"),
    ({"qk_norm": "heads"}, "one head_dim-wide norm shared by the heads (the model has 'heads')"),
    ({"activation": "gelu"}, "its gated MLP is SwiGLU (the model gates with gelu)"),
]


@pytest.mark.parametrize("fields,says", LAYOUTS)
def test_layouts_the_engines_do_not_build_are_refused(fields, says):
    plan = plan_of(replace(load_model("tiny-llama").config, **fields))
    refused(plan, "megatron", says)
    with pytest.raises(UniapError, match="^torchtitan cannot run this plan: its"):
        export_plan(plan, "torchtitan")


def test_megatron_maps_head_qk_norm_and_partial_rotary():
    config = replace(load_model("tiny-llama").config, qk_norm="head", rotary_fraction=0.25)
    _, args = megatron_arguments(export_plan(plan_of(config), "megatron"))
    assert args.qk_layernorm and args.rotary_percent == 0.25


def test_families_are_the_engines_own(tmp_path):
    qwen3 = plan_of(config_file(tmp_path, "qwen3", **{**TINY_LLAMA, "model_type": "qwen3", "head_dim": 32}))
    refused(qwen3, "megatron", "it has no qwen3 model here (families gpt2, llama, mixtral, deepseek_v3)")
    assert "[model]\nname = \"qwen3\"" in export_plan(qwen3, "torchtitan")  # 0.2.2 and 0.3.0 ship models/qwen3
    mistral = plan_of(config_file(tmp_path, "mistral", **{**TINY_LLAMA, "model_type": "mistral",
                                                           "num_key_value_heads": 4}))
    refused(mistral, "torchtitan", "it has no mistral model here (families llama, qwen3, qwen3_moe)")
    for plan in (qwen3, mistral):  # DeepSpeed trains the user's own model code, whatever its family
        assert json.loads(export_plan(plan, "deepspeed"))["zero_optimization"] == {"stage": 0}


def test_torchtitan_qwen3_is_its_qwen3(tmp_path):
    fields = {**TINY_LLAMA, "model_type": "qwen3", "head_dim": 32}
    no_qk_norm = replace(load_model(config_file(tmp_path, "qwen3", **fields)).config, qk_norm="")
    refused(plan_of(no_qk_norm), "torchtitan", "its qwen3 has RMSNorm before attention and MLP and q/k norms over "
                                                 "head_dim")
    refused(plan_of(config_file(tmp_path, "biased", **fields, attention_bias=True)), "torchtitan",
            "its qwen3 has no biases")
    tied = config_file(tmp_path, "tied", **fields, tie_word_embeddings=True)
    assert "flavor" in export_plan(plan_of(tied), "torchtitan")  # qwen3 ties (enable_weight_tying) ...
    piped = uniform_plan(tied, strategy=S(4, 1, 3), chunk_blocks=(2, 2))
    refused(piped, "torchtitan", "its qwen3 does not pipeline a tied output layer")  # ... but not under a pipeline


def test_plan_engine_refuses_the_model_up_front(tmp_path, cli):
    model = load_model(config_file(tmp_path, "biased", **TINY_LLAMA, attention_bias=True))
    cluster, workload = load_cluster("a100-80g:1x2"), Workload(8, 64, "bf16")
    with pytest.raises(UniapError, match=r"^torchtitan cannot run \S+: its llama3 has no biases"):
        engine_plan_search(model, cluster, workload, engine_rules("torchtitan"), workers=1)
    proc = cli("plan", "-m", str(tmp_path / "biased.json"), "-c", "a100-80g:1x2", "-b", "8", "--engine", "megatron",
               check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert re.match(r"uniap: error: megatron cannot run \S+: its linear layers have biases on all", proc.stderr)
