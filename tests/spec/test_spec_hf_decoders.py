"""The dense decoder families of spec.hf: exact parameter counts of real checkpoints and each family's traps.

Reference counts: `sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())` on the meta
device, transformers 5.24.0 (benchmarks/hf_reference_counts.py; tied embeddings count once). Each agrees
with the checkpoint's published count where one is published (model card or the parameter count of its
safetensors), e.g. Mistral-7B-v0.1 7,241,732,096, Llama-3.1-8B 8,030,261,248, Qwen2.5-7B 7.61B, gemma-7b
8,537,680,896, Phi-3-mini 3.8B, pythia-1.4b 1,414,647,808, falcon-7b 6,921,720,704, OLMo-2-1124-7B 7.30B,
starcoder2-7b 7,173,923,840, c4ai-command-r-v01 34,980,831,232 (total_size 69,961,662,464 bytes in fp16).
Gemma 3 4B counts its text decoder only (Gemma3ForCausalLM of its text_config; the checkpoint adds a
~0.42B SigLIP vision tower).
"""

import dataclasses
import json
from pathlib import Path

import pytest

from uniap.errors import UniapError
from uniap.spec import build_layers, load_model, read_hf_config

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"

TRANSFORMERS_COUNTS = {
    "llama3.1-8b": 8_030_261_248,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-8b": 8_190_735_360,
    "qwen3-0.6b": 596_049_920,
    "gemma-7b": 8_537_680_896,
    "gemma-2-9b": 9_241_705_984,
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 3_880_263_168,
    "phi-3-mini-4k": 3_821_079_552,
    "pythia-1.4b": 1_414_647_808,
    "gpt-neox-20b": 20_554_567_680,
    "falcon-7b": 6_921_720_704,
    "falcon-40b": 41_303_293_952,
    "olmo-2-1124-7b": 7_298_617_344,
    "starcoder2-7b": 7_173_923_840,
    "c4ai-command-r-v01": 34_980_831_232,
    "c4ai-command-r-plus": 103_810_674_688,
}


@pytest.mark.parametrize("folder", sorted(TRANSFORMERS_COUNTS))
def test_parameter_count_is_exact(folder):
    spec = load_model(str(DATA / folder), seq_len=2048)
    assert spec.parameters == TRANSFORMERS_COUNTS[folder]
    assert spec.config.name == folder


def cfg(folder: str):
    return read_hf_config(DATA / folder / "config.json")


def data(folder: str) -> dict:
    return json.loads((DATA / folder / "config.json").read_text())


def write(tmp_path: Path, content) -> Path:
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def block(spec, i=0):
    return spec.layers[1 + i]


def test_head_dim_apart_from_hidden_over_heads():
    q = cfg("qwen3-0.6b")  # 16 heads × 128 = 2048 attention width on a 1024 hidden
    assert (q.head_dim, q.kv_channels, q.n_kv_heads) == (128, 128, 8)
    g = cfg("gemma-7b")  # 16 × 256 on 3072
    spec = build_layers(g, 1024)
    attn = 3072 * 4096 * 2 + 3072 * 4096 * 2  # q, o + k, v (16 kv heads)
    assert block(spec).params == attn + 3 * 3072 * 24576 + 2 * 3072


def test_implied_biases():
    q2 = cfg("qwen2.5-7b")  # q/k/v biased, output and MLP not: no field says so
    assert (q2.qkv_bias, q2.out_bias, q2.mlp_bias) == (True, False, False)
    spec = build_layers(q2, 1024)
    q_w, kv_w, h, f = 3584, 512, 3584, 18944
    mats = 2 * h * q_w + 2 * h * kv_w
    assert block(spec).params == mats + (q_w + 2 * kv_w) + 3 * h * f + 2 * h
    assert block(spec).tp_params == mats + (q_w + 2 * kv_w) + 3 * h * f  # column biases shard
    neox = cfg("pythia-1.4b")  # attention_bias defaults on, the MLP always has biases, LayerNorms too
    assert (neox.qkv_bias, neox.out_bias, neox.mlp_bias, neox.norm, neox.norm_bias) == \
        (True, True, True, "layernorm", True)
    star = cfg("starcoder2-7b")
    assert star.qkv_bias and star.mlp_bias and star.dropout and not star.gated_mlp


def test_parallel_residual_and_shared_norm():
    f7 = build_layers(cfg("falcon-7b"), 2048)  # one LayerNorm feeds attention and MLP
    h = 4544
    assert f7.config.parallel_residual and f7.config.shared_norm and f7.config.n_kv_heads == 1
    assert block(f7).params == h * (71 * 64) * 2 + 2 * h * 64 + 2 * h * 4 * h + 2 * h
    f40 = cfg("falcon-40b")  # new decoder architecture: two norms side by side, 8 kv heads
    assert f40.parallel_residual and not f40.shared_norm and f40.n_kv_heads == 8
    neox = build_layers(cfg("pythia-1.4b"), 2048)
    seq = dataclasses.replace(neox.config, parallel_residual=False)
    # The parallel block keeps the block input once for both norms.
    assert block(neox).act_other == block(build_layers(seq, 2048)).act_other - 2.0 * 2048 * 2048
    assert neox.config.rotary_fraction == 0.25


def test_tied_embeddings_count_once():
    gemma = build_layers(cfg("gemma-2-9b"), 1024)
    assert gemma.config.tied_embeddings and gemma.tied_params == 256000 * 3584
    assert gemma.parameters == sum(layer.params for layer in gemma.layers) - 256000 * 3584
    assert not cfg("qwen3-8b").tied_embeddings and cfg("qwen3-0.6b").tied_embeddings


def test_qk_norms():
    h = 4096
    qwen3 = build_layers(cfg("qwen3-8b"), 1024)  # one 128-wide RMSNorm each for q and k, replicated under tp
    no_norm = build_layers(dataclasses.replace(qwen3.config, qk_norm=""), 1024)
    assert block(qwen3).params - block(no_norm).params == 2 * 128
    assert block(qwen3).tp_params == block(no_norm).tp_params
    olmo = build_layers(cfg("olmo-2-1124-7b"), 1024)  # RMSNorm over all heads, after each sublayer
    assert olmo.config.block_norms == "post" and olmo.config.qk_norm == "full"
    assert block(olmo).params == 4 * h * h + 3 * h * 11008 + 2 * h + 2 * h
    plus = cfg("c4ai-command-r-plus")  # Cohere: one weight per head, LayerNorm without bias
    assert (plus.qk_norm, plus.norm, plus.norm_bias) == ("heads", "layernorm", False)
    assert cfg("c4ai-command-r-v01").qk_norm == ""


def test_sliding_window_counts_only_the_window():
    mistral = cfg("mistral-7b-v0.1")
    assert mistral.sliding_window == 4096 and mistral.sliding_layers == tuple(range(32))
    full = dataclasses.replace(mistral, sliding_window=0, sliding_layers=())
    for s in (2048, 4096):  # the window does not bind: same figures as full attention
        assert block(build_layers(mistral, s)).signature == block(build_layers(full, s)).signature
    s = 16384
    windowed, dense = block(build_layers(mistral, s)), block(build_layers(full, s))
    score_flops = lambda pairs: 2.0 * 2.0 * pairs * 4096  # QKᵀ and scores·V over 32 heads × 128
    assert dense.flops - windowed.flops == pytest.approx(score_flops(s * s) - score_flops(s * 4096))
    attn = next(op for op in windowed.ops if type(op).__name__ == "Attention")
    assert (attn.queries, attn.keys, attn.causal) == (s, 4096, False)


def test_alternating_windows_make_blocks_differ():
    gemma2 = cfg("gemma-2-9b")  # even blocks slide over 4096 tokens, odd ones attend fully
    assert gemma2.sliding_layers == tuple(range(0, 42, 2))
    assert (gemma2.attn_softcap, gemma2.logit_softcap, gemma2.block_norms) == (50.0, 30.0, "sandwich")
    long = build_layers(gemma2, 8192)
    assert block(long, 0).signature != block(long, 1).signature
    assert block(long, 0).signature == block(long, 2).signature and block(long, 1).signature == block(long, 3).signature
    short = build_layers(gemma2, 4096)
    assert len({layer.signature for layer in short.layers[1:-1]}) == 1
    gemma3 = cfg("gemma-3-4b")  # five local layers, then a global one
    assert gemma3.sliding_window == 1024 and [i for i in range(34) if i not in gemma3.sliding_layers] == \
        [5, 11, 17, 23, 29]


def test_sliding_window_fields(tmp_path):
    mistral = data("mistral-7b-v0.1")
    assert read_hf_config(write(tmp_path, {**mistral, "sliding_window": None})).sliding_window == 0  # v0.2+
    qwen = data("qwen2.5-7b")
    on = read_hf_config(write(tmp_path, {**qwen, "use_sliding_window": True, "sliding_window": 4096,
                                         "max_window_layers": 20}))
    assert on.sliding_window == 4096 and on.sliding_layers == tuple(range(20, 28))
    kinds = ["full_attention"] * 27 + ["sliding_attention"]
    listed = read_hf_config(write(tmp_path, {**qwen, "use_sliding_window": True, "layer_types": kinds}))
    assert listed.sliding_layers == (27,)
    with pytest.raises(UniapError, match="'layer_types' must list 28"):
        read_hf_config(write(tmp_path, {**qwen, "layer_types": ["full_attention"]}))


def test_rope_scaling_defaults_to_the_pretraining_length():
    llama31 = cfg("llama3.1-8b")
    assert llama31.max_seq == 8192 and dataclasses.replace(llama31, name="llama3-8b") == cfg("llama3-8b")
    assert load_model(str(DATA / "llama3.1-8b")).seq_len == 8192
    assert load_model(str(DATA / "llama3.1-8b"), seq_len=131072).seq_len == 131072  # RoPE has no table


def test_vocabulary_as_stored():
    # pythia's 50,277-token tokenizer is padded to 50,304 rows in the checkpoint; the count uses the rows.
    assert cfg("pythia-1.4b").vocab == 50304 and cfg("phi-3-mini-4k").vocab == 32064


@pytest.mark.parametrize("folder, change, message", [
    ("falcon-7b", {"alibi": True}, "ALiBi positions"),
    ("gemma-3-4b", {"text_config": None}, "needs a 'text_config'"),
    ("llama3.1-8b", {"hidden_act": "gelu_quick"}, "unsupported activation 'gelu_quick'"),
    ("llama3.1-8b", {"rope_scaling": "llama3"}, "'rope_scaling' must be an object"),
    ("llama3.1-8b", {"rope_scaling": {"rope_type": "llama3", "original_max_position_embeddings": "8k"}},
     "original_max_position_embeddings must be a positive integer"),
    ("falcon-7b", {"apply_residual_connection_post_layernorm": True}, "post_layernorm=true is not supported"),
    ("gemma-2-9b", {"layer_types": ["sliding_attention", "local"] * 21}, "'layer_types' must list 42"),
    ("pythia-1.4b", {"rotary_pct": 1.5}, "'rotary_pct' must be in"),
    ("qwen3-8b", {"head_dim": 0}, "'head_dim' must be a positive integer"),
    ("mistral-7b-v0.1", {"num_key_value_heads": 5}, "5 key/value heads must divide 32 heads"),
])
def test_bad_decoder_configs_raise_one_line(tmp_path, folder, change, message):
    path = write(tmp_path, {**data(folder), **change})
    with pytest.raises(UniapError, match=message) as exc:
        read_hf_config(path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


def test_configs_round_trip_through_json():
    from uniap.spec.model import ModelConfig

    for folder in ("gemma-2-9b", "falcon-7b", "qwen3-0.6b"):
        config = cfg(folder)
        assert ModelConfig(**json.loads(json.dumps(config.to_json()))) == config
