"""Layer chains: names, FLOPs, activations (Korthikanti et al. 2022), tp figures, folding signatures."""

import dataclasses

import pytest

from uniap.errors import UniapError
from uniap.spec import ModelConfig, build_layers, load_model, zoo_config, zoo_names

DECODERS = [n for n in zoo_names() if zoo_config(n).family in ("gpt2", "llama")]


def by_name(spec):
    return {layer.name: layer for layer in spec.layers}


# --- names and chain order ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "gpt2", "llama3-8b", "bert-large", "vit-huge"])
def test_decoder_like_chain_is_embed_blocks_head(name):
    spec = load_model(name)
    L = spec.config.layers
    assert [layer.name for layer in spec.layers] == ["embed"] + [f"block.{i}" for i in range(L)] + ["head"]
    assert spec.layers[0].kind in ("embedding", "patch_embed")
    assert {layer.kind for layer in spec.layers[1:L + 1]} == {"block"}
    assert spec.layers[L + 1].kind == "head"


def test_t5_chain():
    spec = load_model("t5-large")
    names = [layer.name for layer in spec.layers]
    assert names == ["embed"] + [f"enc.{i}" for i in range(24)] + [f"dec.{i}" for i in range(24)] + ["head"]


def test_swin_chain_and_stages():
    spec = load_model("swin-huge")
    names = [layer.name for layer in spec.layers]
    expected = ["embed"]
    for stage, depth in enumerate((2, 2, 42, 2)):
        expected += [f"swin.{stage}.{i}" for i in range(depth)]
        if stage < 3:
            expected.append(f"merge.{stage}")
    assert names == expected + ["head"]
    firsts = [by_name(spec)[f"swin.{st}.0"] for st in range(4)]
    assert [(b.tokens, b.width) for b in firsts] == [(3136, 320), (784, 640), (196, 1280), (49, 2560)]
    for a, b in zip(firsts, firsts[1:]):  # width doubles, resolution halves (tokens / 4)
        assert b.width == 2 * a.width and b.tokens * 4 == a.tokens
    for st in range(3):
        merge = by_name(spec)[f"merge.{st}"]
        assert merge.kind == "merge" and merge.tokens == firsts[st + 1].tokens and merge.width == firsts[st + 1].width
        assert merge.out_elems == firsts[st + 1].tokens * firsts[st + 1].width
        assert merge.params == 2 * 4 * firsts[st].width + 8 * firsts[st].width ** 2
    assert by_name(spec)["swin.3.0"].tp_divides == (64, 4 * 2560)


def test_swin_window_attention_flops():
    cfg = zoo_config("swin-huge")
    spec = load_model("swin-huge")
    b = by_name(spec)["swin.0.0"]
    n, C, w = 3136, 320, 7
    windows = (56 // w) ** 2
    dense = 2 * n * C * 3 * C + 2 * n * C * C + 2 * n * C * 4 * C * 2
    assert b.flops == pytest.approx(dense + 4 * windows * w ** 4 * C)
    assert b.act_scores == 2 * cfg.heads * windows * w ** 4  # no dropout: the softmax output only
    assert b.tp_comm_elems == 2 * n * C


def test_vision_token_counts_and_seq_len_ignored():
    assert load_model("vit-huge").seq_len == 197 and load_model("vit-huge-14").seq_len == 257
    assert load_model("vit-huge", seq_len=4096).seq_len == 197
    spec = load_model("vit-huge")
    assert {layer.tokens for layer in spec.layers} == {197}
    embed = spec.layers[0]
    assert embed.kind == "patch_embed" and embed.flops == 2 * 196 * 3 * 16 * 16 * 1280


# --- FLOPs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2", "gpt3-175b", "gpt-1t"])
def test_gpt_flops_match_megatron_formula(name):
    # Narayanan et al. 2021 eq. 3 without recomputation: 72·B·s·L·h²·(1 + s/6h + V/12hL) per iteration.
    spec = load_model(name)
    s, L, h, V = spec.seq_len, spec.config.layers, spec.config.hidden, spec.config.vocab
    assert 3 * spec.flops_per_sample() == pytest.approx(72 * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L)),
                                                        rel=1e-12)


@pytest.mark.parametrize("name", DECODERS)
def test_decoder_flops_are_6_n_tokens_plus_attention(name):
    spec = load_model(name)
    cfg, s = spec.config, spec.seq_len
    attention = 3 * 4 * s * s * cfg.heads * cfg.head_dim * cfg.layers
    # N without the input-embedding look-up (no matmul), with the tied matrix the head multiplies by.
    matmul_params = spec.parameters - spec.layers[0].params + spec.tied_params
    assert 3 * spec.flops_per_sample() == pytest.approx(6 * matmul_params * s + attention, rel=0.01)
    if cfg.tied_embeddings:  # plain N (embedding included once) is as good for tied models
        assert 3 * spec.flops_per_sample() == pytest.approx(6 * spec.parameters * s + attention, rel=0.01)


def test_t5_decoder_block_adds_cross_attention():
    spec = load_model("t5-large")
    enc, dec = by_name(spec)["enc.5"], by_name(spec)["dec.5"]
    s, h = 512, 1024
    cross = 2 * s * h * 3 * h + 4 * s * s * h + 2 * s * h * h
    assert dec.flops == pytest.approx(enc.flops + cross)
    assert enc.tp_comm_elems == 2 * s * h and dec.tp_comm_elems == 3 * s * h
    assert enc.out_elems == dec.out_elems == 2 * s * h
    assert spec.layers[0].tokens == 2 * s and spec.layers[0].tp_comm_elems == 2 * s * h
    # relative-position tables (32 buckets × 16 heads) where HF keeps them; encoder's final norm in enc.23
    assert by_name(spec)["enc.0"].params == enc.params + 32 * 16
    assert by_name(spec)["dec.0"].params == dec.params + 32 * 16
    assert by_name(spec)["enc.23"].params == enc.params + h


# --- activations ----------------------------------------------------------------------------------
def test_gpt_block_activations_are_korthikanti():
    spec = load_model("gpt3-175b")
    s, h, a = 2048, 12288, 96
    b = spec.layers[1]
    assert b.act_other == 10 * s * h
    assert b.act_tp == 24 * s * h
    assert b.act_scores == 5 * a * s * s
    assert b.act_input == 2 * s * h
    assert b.act_other + b.act_tp + b.act_scores == s * h * 34 + 5 * a * s * s
    assert b.flops == 24 * s * h * h + 4 * s * s * h


def test_llama_block_accounts_for_gqa_swiglu_and_no_dropout():
    spec = load_model("llama2-70b")
    s, h, a, g, d, f = 4096, 8192, 64, 8, 128, 28672
    b = spec.layers[1]
    assert b.act_other == 8 * s * h  # two norm inputs, QKV input, MLP input; no dropout masks
    assert b.act_tp == 2 * s * h + 2 * 2 * s * g * d + 2 * s * h + 6 * s * f
    assert b.act_scores == 2 * a * s * s
    assert b.flops == 2 * s * h * (h + 2 * g * d) + 4 * s * s * h + 2 * s * h * h + 3 * 2 * s * h * f
    assert b.tp_divides == (64, 8, 28672)
    assert b.params - b.tp_params == 2 * h  # only the two RMSNorm weights stay replicated


def test_lm_head_and_embedding_figures():
    spec = load_model("gpt2")
    s, h, V = 1024, 768, 50257
    embed, head = spec.layers[0], spec.layers[-1]
    assert embed.params == V * h + 1024 * h and embed.tp_params == V * h and embed.flops == 0
    assert embed.tp_comm_elems == s * h and embed.out_elems == s * h
    assert head.params == V * h + 2 * h and head.tp_params == V * h
    assert head.flops == 2 * s * h * V
    assert head.act_tp == 4 * s * V  # fp32 softmax of the logits, vocabulary-sharded
    assert head.tp_comm_elems == 3 * s
    assert embed.tp_divides == () and head.tp_divides == ()  # vocabulary padded as Megatron does
    assert spec.tied_params == V * h
    assert spec.parameters == sum(layer.params for layer in spec.layers) - V * h


def test_untied_models_have_no_tied_params():
    assert load_model("tiny-gpt").tied_params == 0
    assert load_model("llama2-7b").tied_params == 0
    assert load_model("t5-large").tied_params == 32128 * 1024
    assert load_model("bert-large").tied_params == 30522 * 1024


@pytest.mark.parametrize("name", zoo_names())
def test_figures_are_sane(name):
    spec = load_model(name)
    for layer in spec.layers:
        assert layer.params > 0 and 0 <= layer.tp_params <= layer.params, layer.name
        assert layer.flops >= 0 and layer.tokens > 0 and layer.width > 0, layer.name
        assert min(layer.act_tp, layer.act_other, layer.act_scores) >= 0 and layer.act_input > 0, layer.name
        assert layer.tp_comm_elems >= 0, layer.name
        assert (layer.out_elems == 0) == (layer.kind == "head"), layer.name
        if layer.kind == "block":
            assert layer.tp_comm_elems > 0 and layer.tp_divides and layer.act_scores > 0, layer.name


# --- folding signatures ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2", "tiny-llama", "llama3-405b", "bert-huge", "vit-huge"])
def test_blocks_share_one_signature(name):
    spec = load_model(name)
    blocks = {layer.signature for layer in spec.layers if layer.kind == "block"}
    assert len(blocks) == 1
    sigs = [spec.layers[0].signature, next(iter(blocks)), spec.layers[-1].signature]
    assert len(set(sigs)) == 3


def test_signature_is_equal_exactly_for_identical_layers():
    spec = load_model("t5-large")
    sig = {layer.name: layer.signature for layer in spec.layers}
    assert len({sig[f"enc.{i}"] for i in range(1, 23)}) == 1
    assert len({sig[f"dec.{i}"] for i in range(1, 24)}) == 1
    assert sig["enc.0"] != sig["enc.1"] != sig["enc.23"] and sig["dec.0"] != sig["dec.1"] != sig["enc.1"]
    swin = load_model("swin-huge")
    per_stage = {}
    for layer in swin.layers:
        if layer.kind == "block":
            per_stage.setdefault(layer.name.split(".")[1], set()).add(layer.signature)
    assert all(len(s) == 1 for s in per_stage.values()) and len(set().union(*per_stage.values())) == 4
    assert load_model("gpt2", 512).layers[1].signature != load_model("gpt2", 1024).layers[1].signature


# --- gpt3-13b: attention width 40 × 128 != d_model 5140 ----------------------------------------------
def test_kv_channels_sets_attention_width():
    spec = load_model("gpt3-13b")
    cfg, b = spec.config, spec.layers[1]
    s, h, q = 2048, 5140, 5120
    assert cfg.head_dim == 128
    assert b.flops == 2 * s * h * 3 * q + 4 * s * s * q + 2 * s * q * h + 2 * 2 * s * h * 4 * h
    assert b.tp_divides == (40, 4 * 5140)


# --- errors --------------------------------------------------------------------------------------
def test_sequence_length_limits():
    with pytest.raises(UniapError, match="exceeds the 1024 learned positions"):
        load_model("gpt2", seq_len=2048)
    with pytest.raises(UniapError, match="exceeds the 512"):
        load_model("bert-large", seq_len=1024)
    assert load_model("llama2-7b", seq_len=16384).seq_len == 16384  # RoPE: no table to outgrow
    assert load_model("t5-large", seq_len=1024).seq_len == 1024  # relative positions
    assert load_model("gpt2", seq_len=128).seq_len == 128
    for bad in (0, -3, 1.5, "64"):
        with pytest.raises(UniapError, match="positive integer"):
            load_model("tiny-gpt", seq_len=bad)


@pytest.mark.parametrize("change, message", [
    (dict(family="mamba"), "unknown family"),
    (dict(hidden=130), "not a multiple of 4 heads"),
    (dict(kv_heads=3), "must divide 4 heads"),
    (dict(layers=0), "layers must be a positive integer"),
    (dict(vocab=0), "needs a vocabulary"),
    (dict(norm="batchnorm"), "norm must be"),
])
def test_bad_configs_raise_one_line(change, message):
    cfg = dataclasses.replace(zoo_config("tiny-gpt"), **change)
    with pytest.raises(UniapError, match=message) as exc:
        build_layers(cfg, 64)
    assert "\n" not in str(exc.value)


def test_bad_vision_configs():
    with pytest.raises(UniapError, match="sum of depths"):
        build_layers(dataclasses.replace(zoo_config("swin-huge"), layers=47), 1)
    with pytest.raises(UniapError, match="patch_size"):
        build_layers(dataclasses.replace(zoo_config("vit-huge"), patch_size=0), 1)


def test_tiny_models_build_quickly_and_are_small():
    for name in ("tiny-gpt", "tiny-llama"):
        spec = load_model(name)
        assert spec.seq_len == 64 and len(spec.layers) == 6 and spec.parameters < 1_000_000
    cfg = ModelConfig(name="x", family="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=100,
                      max_seq=32, gated_mlp=True, norm="rmsnorm", bias=False, learned_positions=False)
    assert build_layers(cfg, 16).layers[1].tp_divides == (4, 2, 128)
