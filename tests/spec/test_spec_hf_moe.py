"""Mixture-of-experts configs of spec.hf: exact parameter counts of real checkpoints, active counts, the
MoE / dense block patterns, MLA's FLOPs, and the one-line refusal of an MoE type not read.

Reference counts: `sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())` on the meta
device, transformers 5.24.0 (benchmarks/hf_reference_counts.py). DeepSeek-V3's `e_score_correction_bias` is
a buffer there (not counted), and its MTP module is not built (`mtp_parameters` counts it apart).
"""

import json
from pathlib import Path

import pytest

from uniap.errors import UniapError
from uniap.spec import build_layers, load_model, read_hf_config
from uniap.spec.families import mtp_parameters
from uniap.spec.ops import Attention, Gemm, GroupedGemm

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"

TRANSFORMERS_COUNTS = {
    "mixtral-8x7b": 46_702_792_704,
    "qwen2-57b-a14b": 57_408_658_944,
    "qwen3-30b-a3b": 30_532_122_624,
    "deepseek-v3": 671_026_404_352,
    "gpt-oss-20b": 20_914_757_184,
    "gpt-oss-120b": 116_829_156_672,
}

# Published active parameters per token (billions, as rounded by the source) and whether the source leaves
# the input embedding table out (a look-up, not a matmul: DeepSeek-V3's README_WEIGHTS "36.6B including
# 0.9B for the output head", OpenAI's gpt-oss model card 3.61B / 5.13B); the others count everything.
PUBLISHED_ACTIVE = {
    "mixtral-8x7b": (12.9, False),  # Mixtral of Experts (Jiang et al. 2024): 13B active, the model card 12.9B
    "qwen2-57b-a14b": (14, False),  # "A14B"
    "qwen3-30b-a3b": (3.3, False),  # Qwen3 report, Table 2 / model card: 3.3B activated
    "deepseek-v3": (36.6, True),
    "gpt-oss-20b": (3.61, True),
    "gpt-oss-120b": (5.13, True),
}


def cfg(folder):
    return read_hf_config(DATA / folder / "config.json")


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("folder", sorted(TRANSFORMERS_COUNTS))
def test_parameter_count_is_exact(folder):
    spec = load_model(str(DATA / folder), seq_len=2048)
    assert spec.parameters == TRANSFORMERS_COUNTS[folder]
    assert spec.config.name == folder and spec.config.is_moe
    assert (DATA / folder / "SOURCE").read_text().strip()


@pytest.mark.parametrize("folder", sorted(PUBLISHED_ACTIVE))
def test_active_parameters_match_the_published_figure(folder):
    spec = load_model(str(DATA / folder), seq_len=2048)
    published, without_embedding = PUBLISHED_ACTIVE[folder]
    active = spec.active_parameters - (spec.config.vocab * spec.config.hidden if without_embedding else 0)
    unit = 10.0 ** -len(str(published).partition(".")[2])  # the source's last digit (Qwen3's 3.35B reads "3.3B")
    assert abs(active / 1e9 - published) < unit


def test_active_parameters_by_hand():
    spec = build_layers(cfg("mixtral-8x7b"), 1024)
    h, f = 4096, 14336
    expert = 3 * h * f  # gate, up, down
    assert spec.active_parameters == spec.parameters - 32 * (8 - 2) * expert
    dense = load_model("llama3-8b")
    assert dense.active_parameters == dense.parameters


def test_qwen_sparse_step_and_mlp_only_layers(tmp_path):
    data = json.loads((DATA / "qwen2-57b-a14b" / "config.json").read_text())
    assert cfg("qwen2-57b-a14b").moe_layers == tuple(range(28))
    data.update(decoder_sparse_step=2, mlp_only_layers=[3])
    c = read_hf_config(write(tmp_path, data))
    assert c.moe_layers == tuple(i for i in range(28) if i % 2 == 1 and i != 3)
    spec = build_layers(c, 1024)
    h, f, fe, sf = 3584, 18944, 2560, 20480
    dense, moe = spec.layers[1], spec.layers[2]  # block 0 dense, block 1 MoE
    assert dense.experts == 0 and moe.experts == 64
    attn = 2 * h * h + 2 * h * 512 + (h + 2 * 512) + 2 * h  # q, o + k, v; q/k/v biases; two norms
    assert dense.params == attn + 3 * h * f
    # router, routed experts, shared expert and its h → 1 sigmoid gate
    assert moe.params == attn + h * 64 + 64 * 3 * h * fe + 3 * h * sf + h
    assert moe.expert_params == 64 * 3 * h * fe
    assert spec.layers[4].experts == 0  # block 3: listed in mlp_only_layers


def test_deepseek_first_k_dense_and_mtp():
    c = cfg("deepseek-v3")
    assert c.moe_layers == tuple(range(3, 61)) and c.shared_ffn == 2048 and c.mtp_layers == 1
    spec = build_layers(c, 4096)
    kinds = [layer.experts for layer in spec.layers[1:-1]]
    assert kinds == [0] * 3 + [256] * 58
    # The checkpoint adds one MTP module: an MoE block like the last, eh_proj 2h → h and three norms;
    # 671.03B + 11.61B + its own embedding and head copies (0.93B each) = 684.5B, the published 685B.
    h, V = 7168, 129280
    mtp = mtp_parameters(c)
    assert mtp == spec.layers[-2].params + 2 * h * h + 3 * h
    assert abs((spec.parameters + mtp + 2 * V * h) / 685e9 - 1) < 1e-3
    assert round(spec.layers[-2].params / 1e9, 1) == 11.5  # "11.5B unique" MTP block (README_WEIGHTS)


def test_gpt_oss_sinks_biases_and_alternating_window():
    c = cfg("gpt-oss-20b")
    assert c.attn_sinks and c.router_bias and c.expert_bias and c.qkv_bias and c.out_bias
    assert c.sliding_window == 128 and c.sliding_layers == tuple(range(0, 24, 2))
    spec = build_layers(c, 4096)
    h, a, g, d, E, fe = 2880, 64, 8, 64, 32, 2880
    attn = h * a * d * 2 + 2 * h * g * d + (a * d + 2 * g * d) + h + a  # q, o, k, v; biases; sinks
    moe = h * E + E + E * (3 * h * fe + 2 * fe + h)
    assert spec.layers[1].params == attn + moe + 2 * h
    assert spec.layers[1].signature != spec.layers[2].signature  # sliding vs full attention


def test_mla_ops_flops_by_hand():
    c = cfg("deepseek-v3")
    s = 4096
    spec = build_layers(c, s)
    a, h, rq, rkv, dn, dr, dv = 128, 7168, 1536, 512, 128, 64, 128
    matmuls = (h * rq + rq * a * (dn + dr)  # q_a_proj, q_b_proj
               + h * (rkv + dr) + rkv * a * (dn + dv)  # kv_a_proj_with_mqa, kv_b_proj
               + a * dv * h)  # o_proj
    attention = 2 * s * s * a * (dn + dr) + 2 * s * s * a * dv  # QKᵀ and scores·V over s² pairs
    mlp = 3 * h * 18432
    block = spec.layers[1]  # dense
    assert block.flops == 2 * s * matmuls + attention + 2 * s * mlp
    ops = block.ops
    gemms = [o for o in ops if isinstance(o, Gemm)]
    assert [(g.k, g.n, g.split) for g in gemms[:5]] == [(h, rq, ""), (rq, a * (dn + dr), "n"), (h, rkv + dr, ""),
                                                        (rkv, a * (dn + dv), "n"), (a * dv, h, "k")]
    att = next(o for o in ops if isinstance(o, Attention))
    assert (att.heads, att.head_dim, att.value_dim, att.causal) == (a, dn + dr, dv, True)
    assert sum(2 * g.rows * g.k * g.n * g.count for g in gemms) + attention == block.flops
    # tp shards the heads: the up projections and o_proj; the down projections and latent norms stay whole
    assert block.tp_params == rq * a * (dn + dr) + rkv * a * (dn + dv) + a * dv * h + mlp
    assert block.tp_divides == (a, 18432)
    moe = spec.layers[4]
    assert any(isinstance(o, GroupedGemm) and o.experts == 256 and o.topk == 8 for o in moe.ops)
    assert moe.tp_divides == (a, 2048)


@pytest.mark.parametrize("model_type, fields", [
    ("dbrx", {"ffn_config": {"moe_num_experts": 16, "moe_top_k": 4}}),
    ("jamba", {"num_experts": 16, "num_experts_per_tok": 2}),
    ("granitemoe", {"num_local_experts": 40, "num_experts_per_tok": 8}),
    ("olmoe", {"num_experts": 64, "num_experts_per_tok": 8}),
    ("deepseek_v2", {"n_routed_experts": 160, "num_experts_per_tok": 6}),
])
def test_unread_moe_type_is_refused_in_one_line(tmp_path, model_type, fields):
    path = write(tmp_path, {"model_type": model_type, "hidden_size": 1024, **fields})
    with pytest.raises(UniapError) as err:
        read_hf_config(path)
    message = str(err.value)
    assert "\n" not in message and f"mixture-of-experts model_type {model_type!r}" in message


def test_bad_expert_fields_fail_in_one_line(tmp_path):
    data = json.loads((DATA / "mixtral-8x7b" / "config.json").read_text())
    data["num_experts_per_tok"] = 9
    with pytest.raises(UniapError, match="experts_per_token must be in 1..8"):
        read_hf_config(write(tmp_path, data))
    data = json.loads((DATA / "qwen3-30b-a3b" / "config.json").read_text())
    data["mlp_only_layers"] = [48]
    with pytest.raises(UniapError, match="mlp_only_layers"):
        read_hf_config(write(tmp_path, data))


def test_zoo_presets_equal_their_configs():
    for name in ("mixtral-8x7b", "deepseek-v3"):
        assert load_model(name).config == cfg(name)
    qwen = load_model("qwen3-235b-a22b", seq_len=4096)
    assert round(qwen.parameters / 1e9) == 235 and round(qwen.active_parameters / 1e9) == 22
