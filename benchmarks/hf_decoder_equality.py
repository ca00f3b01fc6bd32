"""Our one decoder (`uniap.models.decoder`) against transformers' own modelling code: for a tiny model of each
family, copy transformers' random weights into ours and compare the logits. Needs `transformers` (not a
project dependency); run it in the private venv of benchmarks/hf_reference_counts.py:

    PYTHONPATH=src .venv-ref/bin/python benchmarks/hf_decoder_equality.py

Families whose numerics we do not reproduce are left out and said so: gemma* (√hidden embedding scale,
(1 + w) norms, soft-capping) and cohere (interleaved rotary, logit scale).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from uniap.models import build_model
from uniap.spec.hf import read_hf_config

TINY = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=3, intermediate_size=96, vocab_size=128,
            rope_theta=10000.0, rms_norm_eps=1e-5, layer_norm_eps=1e-5, norm_epsilon=1e-5, layer_norm_epsilon=1e-5,
            tie_word_embeddings=False, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES = {  # config fields on top of TINY (a window of 5 tokens binds at 16)
    "llama": {"model_type": "llama", "num_key_value_heads": 2},
    "mistral": {"model_type": "mistral", "num_key_value_heads": 2, "sliding_window": 5},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2},
    "qwen3": {"model_type": "qwen3", "num_key_value_heads": 2, "head_dim": 32},
    "phi3": {"model_type": "phi3", "num_key_value_heads": 2, "sliding_window": 5},
    "olmo2": {"model_type": "olmo2", "num_key_value_heads": 2},
    "starcoder2": {"model_type": "starcoder2", "num_key_value_heads": 2, "sliding_window": 5},
    "gpt_neox": {"model_type": "gpt_neox", "rotary_pct": 0.25, "hidden_act": "gelu"},
    "falcon (7B layout)": {"model_type": "falcon", "multi_query": True, "parallel_attn": True},
    "falcon (40B layout)": {"model_type": "falcon", "new_decoder_architecture": True, "num_kv_heads": 2},
}
# Our block's names → transformers' (per layer), where only the names differ.
_LLAMA_NAMES = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
                "attn.o": "self_attn.o_proj", "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj",
                "mlp.down": "mlp.down_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj",
                "norm1": "input_layernorm", "norm2": "post_attention_layernorm",
                "attn.q_norm.norm": "self_attn.q_norm", "attn.k_norm.norm": "self_attn.k_norm"}
_OLMO2_NAMES = {**_LLAMA_NAMES, "post_norm1": "post_attention_layernorm", "post_norm2": "post_feedforward_layernorm",
                "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}


def _by_name(ours: dict, theirs: dict, names: dict, layer: str, top: dict) -> dict:
    out = {}
    for name in ours:
        if name.startswith("blocks."):
            _, i, rest = name.split(".", 2)
            module, leaf = rest.rsplit(".", 1)
            out[name] = theirs[f"{layer}.{i}.{names[module]}.{leaf}"]
        else:
            out[name] = theirs[top[name]]
    return out


def _split(weights: dict, fused: str, parts) -> None:
    """Split fused per-layer matrices of `weights` in place: {prefix}{fused} → our names with `parts` sizes."""
    for key in [k for k in weights if fused in k]:
        prefix, leaf = key.split(fused)
        for name, chunk in zip(parts[0], weights.pop(key).split(parts[1])):
            weights[f"{prefix}{name}{leaf}"] = chunk


def _weights(family: str, hf, cfg) -> dict:
    theirs = dict(hf.named_parameters())
    ours = dict(build_model(cfg).named_parameters())
    h, a, g, d, f = cfg.hidden, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn
    if family.startswith("falcon"):
        for k in [k for k in theirs if "query_key_value" in k]:
            w = theirs.pop(k)
            if cfg.shared_norm:  # multi-query: [q of every head, k, v]
                q, k_, v = w.split([a * d, d, d])
            else:  # grouped: per key/value group its queries, then k and v
                w = w.view(g, a // g + 2, d, h)
                q, k_, v = w[:, :-2].reshape(a * d, h), w[:, -2].reshape(g * d, h), w[:, -1].reshape(g * d, h)
            base = k.replace("self_attention.query_key_value.weight", "")
            theirs.update({base + "q.weight": q, base + "k.weight": k_, base + "v.weight": v})
        names = {"attn.q": "q", "attn.k": "k", "attn.v": "v", "attn.o": "self_attention.dense",
                 "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h",
                 "norm1": "input_layernorm" if cfg.shared_norm else "ln_attn", "norm2": "ln_mlp"}
        return _by_name(ours, theirs, names, "transformer.h", {
            "embed.tok.weight": "transformer.word_embeddings.weight", "head.norm.weight": "transformer.ln_f.weight",
            "head.norm.bias": "transformer.ln_f.bias", "head.lm.weight": "lm_head.weight"})
    if family == "gpt_neox":
        for k in [k for k in theirs if "query_key_value" in k]:
            w = theirs.pop(k).view(a, 3, d, *([h] if k.endswith("weight") else []))  # per head: q, k, v
            base, leaf = k.split("attention.query_key_value")
            for j, x in enumerate("qkv"):
                theirs[f"{base}{x}{leaf}"] = w[:, j].reshape(a * d, *([h] if leaf == ".weight" else []))
        names = {"attn.q": "q", "attn.k": "k", "attn.v": "v", "attn.o": "attention.dense",
                 "mlp.fc": "mlp.dense_h_to_4h", "mlp.proj": "mlp.dense_4h_to_h", "norm1": "input_layernorm",
                 "norm2": "post_attention_layernorm"}
        return _by_name(ours, theirs, names, "gpt_neox.layers", {
            "embed.tok.weight": "gpt_neox.embed_in.weight", "head.norm.weight": "gpt_neox.final_layer_norm.weight",
            "head.norm.bias": "gpt_neox.final_layer_norm.bias", "head.lm.weight": "lm_head.weight"})
    if family == "phi3":
        _split(theirs, "self_attn.qkv_proj", (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                                                   [a * d, g * d, g * d]))
        _split(theirs, "mlp.gate_up_proj", (("mlp.gate_proj", "mlp.up_proj"), [f, f]))
    names = _OLMO2_NAMES if family == "olmo2" else _LLAMA_NAMES
    return _by_name(ours, theirs, names, "model.layers", {
        "embed.tok.weight": "model.embed_tokens.weight", "head.norm.weight": "model.norm.weight",
        "head.norm.bias": "model.norm.bias", "head.lm.weight": "lm_head.weight"})


def main() -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, TINY["vocab_size"], (2, 16))
    print(f"transformers {transformers.__version__}: max |logit difference|, same weights, 16 tokens")
    for family, fields in FAMILIES.items():
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "config.json"
            path.write_text(json.dumps({**TINY, **fields}))
            hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).eval()
            cfg = read_hf_config(path)
        ours = build_model(cfg).eval()
        with torch.no_grad():
            weights = _weights(family, hf, cfg)
            for name, p in ours.named_parameters():
                p.copy_(weights[name])
            diff = (hf(input_ids=tokens).logits - ours(tokens)).abs().max().item()
        print(f"  {family:22s} {diff:.1e}")


if __name__ == "__main__":
    main()
