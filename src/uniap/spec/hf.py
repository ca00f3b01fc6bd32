"""Hugging Face `config.json` → ModelConfig, for gpt2, bert, t5, vit, swin and the decoders of
DECODER_TYPES: dense (llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3, phi3, gpt_neox, falcon, olmo2,
starcoder2, cohere) and mixture-of-experts (mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss).

Field names and defaults are those of the transformers configuration classes (GPT2Config, LlamaConfig,
…; transformers 5.24): a field the class defaults is optional here with the same default; a field that
defines the architecture's size is required (except Gemma 3, whose released `text_config`s leave the
sizes to the class). Every problem is one UniapError line naming the file.

The decoders share one reader, driven by the config's fields; `_DECODERS` holds what each family implies
without a field saying so (its norm, MLP, biases, q/k norms, residual layout) and its class defaults.
Sequence length: a RoPE-scaled config that states the length it was pre-trained at
(`original_max_position_embeddings`: Llama 3.1, Phi-3 128k) defaults to it, not the extended window; one that
does not (Gemma 3) defaults to `max_position_embeddings`.

Mixtures of experts (`_moe_fields`): which blocks are MoE follows the transformers modeling code
(Qwen: `decoder_sparse_step` and `mlp_only_layers`; DeepSeek-V3: all from `first_k_dense_replace` on,
`moe_layer_freq` is ignored as transformers ignores it),
and the counts are those transformers builds: DeepSeek-V3's `e_score_correction_bias` is a buffer (not
counted), its MTP module is not built (`ModelConfig.mtp_layers` keeps it, `families.mtp_parameters` counts
it); `norm_topk_prob` and the routing functions have no parameters. An MoE config of another model_type is
refused in one line naming it (MOE_KEYS tell an MoE config apart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from uniap.errors import UniapError
from uniap.jsonfile import read_json_object
from uniap.spec.families import check_config
from uniap.spec.model import ModelConfig

_MISSING = object()


class _Fields:
    """Typed access to the JSON object, with errors that name the file and the field.

    `defaults`: the configuration class's defaults for a field the file leaves out (or null); they take
    precedence over the generic default a call gives."""

    def __init__(self, data: dict, path: Path, model_type: str, defaults: dict | None = None):
        self.data, self.path, self.model_type = data, path, model_type
        self.defaults = defaults or {}

    def fail(self, problem: str) -> UniapError:
        return UniapError(f"{self.path}: {problem}")

    def _get(self, key: str, default):
        default = self.defaults.get(key, default)  # the family's class default before the generic one
        value = self.data.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                raise self.fail(f"missing field {key!r} for model_type {self.model_type!r}")
            return default
        return value

    def int(self, key: str, default=_MISSING, *, positive: bool = True) -> int:
        value = self._get(key, default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or (positive and value < 1):
            raise self.fail(f"field {key!r} must be a positive integer, got {value!r}")
        return value

    def number(self, key: str, default=_MISSING) -> float:
        value = self._get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise self.fail(f"field {key!r} must be a positive number, got {value!r}")
        return float(value)

    def bool(self, key: str, default=_MISSING) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"field {key!r} must be true or false, got {value!r}")
        return value

    def fraction(self, key: str, default=_MISSING) -> float:
        value = self.number(key, default)
        if value > 1:
            raise self.fail(f"field {key!r} must be in (0, 1], got {value!r}")
        return value

    def _switched_off(self, key: str) -> bool:
        # An optional feature (sliding window, soft-capping): null or 0 in the file, or absent with no class
        # default, turns it off.
        return self.data[key] in (None, 0) if key in self.data else self.defaults.get(key) is None

    def optional_int(self, key: str) -> int:
        return 0 if self._switched_off(key) else self.int(key)

    def optional_number(self, key: str) -> float:
        return 0.0 if self._switched_off(key) else self.number(key)

    def str(self, key: str, default=_MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.fail(f"field {key!r} must be a string, got {value!r}")
        return value

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self._get(key, _MISSING)
        if (not isinstance(value, list) or not value
                or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value)):
            raise self.fail(f"field {key!r} must be a non-empty list of positive integers, got {value!r}")
        return tuple(value)

    def image_size(self, key: str, default: int) -> int:
        # ViT/Swin accept an int or an [height, width] pair; only square inputs are modelled.
        value = self._get(key, default)
        if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
            value = value[0]
        if isinstance(value, list):
            raise self.fail(f"field {key!r}: only square sizes are supported, got {value!r}")
        self.data = {**self.data, key: value}
        return self.int(key)

    def num_classes(self) -> int:
        # Serialized configs carry `id2label` (one entry per class); some carry `num_labels`. Neither
        # present: 1000 (ImageNet-1k), the usual planning target.
        id2label = self.data.get("id2label")
        if isinstance(id2label, dict) and id2label:
            return len(id2label)
        return self.int("num_labels", 1000)


def _model_name(data: dict, path: Path) -> str:
    name = data.get("_name_or_path")
    if isinstance(name, str) and name.strip():
        name = name.strip().rstrip("/")
        if name.startswith(("/", "./", "../", "~")):  # a local path: keep its last folder
            name = Path(name).name or name
        return name
    return path.resolve().parent.name or path.stem


def _gpt2(f: _Fields, name: str) -> ModelConfig:
    hidden, heads = f.int("n_embd"), f.int("n_head")
    return ModelConfig(name=name, family="gpt2", layers=f.int("n_layer"), hidden=hidden, heads=heads,
                       ffn=f.int("n_inner", 4 * hidden), vocab=f.int("vocab_size"),
                       max_seq=f.int("n_positions", 1024), tied_embeddings=f.bool("tie_word_embeddings", True))


def _bert(f: _Fields, name: str) -> ModelConfig:
    return ModelConfig(
        name=name, family="bert", layers=f.int("num_hidden_layers"), hidden=f.int("hidden_size"),
        heads=f.int("num_attention_heads"), ffn=f.int("intermediate_size"), vocab=f.int("vocab_size"),
        max_seq=f.int("max_position_embeddings", 512), type_vocab=f.int("type_vocab_size", 2, positive=False),
        tied_embeddings=f.bool("tie_word_embeddings", True))


def _t5(f: _Fields, name: str) -> ModelConfig:
    hidden, heads, layers = f.int("d_model"), f.int("num_heads"), f.int("num_layers")
    d_kv = f.int("d_kv", 64)
    proj = f.str("feed_forward_proj", "relu")
    parts = proj.split("-")  # as T5Config: "<act>" or "gated-<act>"
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or not parts[-1]:
        raise f.fail(f"field 'feed_forward_proj' must be '<act>' or 'gated-<act>', got {proj!r}")
    return ModelConfig(
        name=name, family="t5", layers=layers, decoder_layers=f.int("num_decoder_layers", layers), hidden=hidden,
        heads=heads, ffn=f.int("d_ff"), vocab=f.int("vocab_size"), max_seq=f.int("n_positions", 512),
        gated_mlp=len(parts) == 2, norm="rmsnorm", bias=False, learned_positions=False,
        tied_embeddings=f.bool("tie_word_embeddings", True), kv_channels=0 if d_kv * heads == hidden else d_kv)


def _vit(f: _Fields, name: str) -> ModelConfig:
    image, patch = f.image_size("image_size", 224), f.image_size("patch_size", 16)
    return ModelConfig(
        name=name, family="vit", layers=f.int("num_hidden_layers"), hidden=f.int("hidden_size"),
        heads=f.int("num_attention_heads"), ffn=f.int("intermediate_size"),
        max_seq=(image // patch) ** 2 + 1, bias=f.bool("qkv_bias", True), image_size=image, patch_size=patch,
        channels=f.int("num_channels", 3), num_classes=f.num_classes())


def _swin(f: _Fields, name: str) -> ModelConfig:
    depths, heads = f.int_list("depths"), f.int_list("num_heads")
    if len(depths) != len(heads):
        raise f.fail(f"'depths' has {len(depths)} stages but 'num_heads' has {len(heads)}")
    if any(h != heads[0] << i for i, h in enumerate(heads)):
        raise f.fail(f"'num_heads' {list(heads)} must double at every stage (as in every released Swin)")
    embed = f.int("embed_dim")
    image, patch = f.image_size("image_size", 224), f.image_size("patch_size", 4)
    return ModelConfig(
        name=name, family="swin", layers=sum(depths), hidden=embed, heads=heads[0],
        ffn=int(round(f.number("mlp_ratio", 4.0) * embed)), max_seq=(image // patch) ** 2,
        bias=f.bool("qkv_bias", True), learned_positions=f.bool("use_absolute_embeddings", False),
        image_size=image, patch_size=patch, channels=f.int("num_channels", 3), num_classes=f.num_classes(),
        depths=depths, window=f.int("window_size", 7))


@dataclass(frozen=True)
class _Decoder:
    """What one decoder model_type implies beyond its config fields, and its class's defaults."""

    norm: str = "rmsnorm"  # norm kind of every block, the final norm and the q/k norms
    norm_bias: bool = True  # a LayerNorm with a bias
    gated: bool = True  # gated MLP (gate, up, down)
    qkv_bias: str | bool = "attention_bias"  # the field switching the q/k/v biases, or a fixed value
    out_bias: str | bool = "attention_bias"  # same for the attention output projection
    mlp_bias: str | bool = False  # same for the MLP matrices
    qk_norm: str = ""  # ModelConfig.qk_norm the family has (`qk_norm_field` switches it)
    qk_norm_field: str = ""  # the field that switches it on ("" = always on when qk_norm is set)
    block_norms: str = "pre"
    parallel_residual: str = ""  # "" never | always | the field switching it (Falcon: _falcon_layout)
    shared_norm: bool = False  # a parallel block's one norm feeds attention and MLP
    sliding: str = ""  # which layers a sliding window applies to: all | qwen (>= max_window_layers) |
    #                    alternate (Gemma 2: even blocks) | pattern (Gemma 3: all but every 6th)
    rotary_field: str = "partial_rotary_factor"  # the field giving the rotated share of each head
    gelu_is_tanh: bool = False  # hidden_act "gelu" means the tanh approximation (Gemma, as transformers)
    moe: str = ""  # the expert layout (`_moe_fields`): mixtral | qwen | deepseek | gpt_oss
    defaults: dict = field(default_factory=dict)  # class defaults for fields a config.json may leave out


_DECODERS: dict[str, _Decoder] = {
    "llama": _Decoder(mlp_bias="mlp_bias", defaults={"tie_word_embeddings": False, "attention_bias": False,
                                                      "mlp_bias": False, "max_position_embeddings": 2048}),
    "mistral": _Decoder(qkv_bias=False, out_bias=False, sliding="all",
                        defaults={"tie_word_embeddings": False, "sliding_window": 4096, "num_key_value_heads": 8,
                                  "max_position_embeddings": 131072}),
    "qwen2": _Decoder(qkv_bias=True, out_bias=False, sliding="qwen",
                      defaults={"tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 4096,
                                "max_window_layers": 28, "max_position_embeddings": 32768}),
    "qwen3": _Decoder(qk_norm="head", sliding="qwen",
                      defaults={"tie_word_embeddings": False, "attention_bias": False, "head_dim": 128,
                                "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
                                "max_position_embeddings": 32768}),
    "gemma": _Decoder(gelu_is_tanh=True, defaults={"tie_word_embeddings": True, "attention_bias": False,
                                                   "head_dim": 256, "max_position_embeddings": 8192}),
    "gemma2": _Decoder(block_norms="sandwich", sliding="alternate", gelu_is_tanh=True,
                       defaults={"tie_word_embeddings": True, "attention_bias": False, "head_dim": 256,
                                 "sliding_window": 4096, "attn_logit_softcapping": 50.0,
                                 "final_logit_softcapping": 30.0, "max_position_embeddings": 8192}),
    "gemma3": _Decoder(qk_norm="head", block_norms="sandwich", sliding="pattern", gelu_is_tanh=True,
                       defaults={"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                                 "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                                 "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
                                 "max_position_embeddings": 131072, "tie_word_embeddings": True,
                                 "attention_bias": False, "sliding_window": 4096, "sliding_window_pattern": 6}),
    "phi3": _Decoder(qkv_bias=False, out_bias=False, sliding="all",
                     defaults={"tie_word_embeddings": False, "max_position_embeddings": 4096}),
    "gpt_neox": _Decoder(norm="layernorm", gated=False, mlp_bias=True, rotary_field="rotary_pct",
                         parallel_residual="use_parallel_residual",
                         defaults={"tie_word_embeddings": False, "attention_bias": True, "rotary_pct": 0.25,
                                   "use_parallel_residual": True, "hidden_act": "gelu",
                                   "max_position_embeddings": 2048}),
    "falcon": _Decoder(norm="layernorm", gated=False, qkv_bias="bias", out_bias="bias", mlp_bias="bias",
                       parallel_residual="parallel_attn",
                       defaults={"tie_word_embeddings": True, "bias": False, "multi_query": True,
                                 "parallel_attn": True, "new_decoder_architecture": False, "alibi": False,
                                 "activation": "gelu", "max_position_embeddings": 2048}),
    "olmo2": _Decoder(qk_norm="full", block_norms="post",
                      defaults={"tie_word_embeddings": False, "attention_bias": False,
                                "max_position_embeddings": 2048}),
    "starcoder2": _Decoder(norm="layernorm", gated=False, qkv_bias="use_bias", out_bias="use_bias",
                           mlp_bias="use_bias", sliding="all",
                           defaults={"tie_word_embeddings": True, "use_bias": True, "num_key_value_heads": 2,
                                     "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 4096}),
    "cohere": _Decoder(norm="layernorm", norm_bias=False, qk_norm="heads", qk_norm_field="use_qk_norm",
                       parallel_residual="always", shared_norm=True,
                       defaults={"tie_word_embeddings": True, "attention_bias": False, "use_qk_norm": False,
                                 "max_position_embeddings": 8192}),
    # --- mixtures of experts (class defaults of transformers 5.24's configuration classes) --------------------
    "mixtral": _Decoder(qkv_bias=False, out_bias=False, sliding="all", moe="mixtral",
                        defaults={"tie_word_embeddings": False, "sliding_window": None, "num_key_value_heads": 8,
                                  "max_position_embeddings": 131072, "num_local_experts": 8,
                                  "num_experts_per_tok": 2}),
    "qwen2_moe": _Decoder(qkv_bias="qkv_bias", out_bias=False, sliding="qwen", moe="qwen",
                          defaults={"tie_word_embeddings": False, "qkv_bias": True, "use_sliding_window": False,
                                    "sliding_window": 4096, "max_window_layers": 28, "max_position_embeddings": 32768,
                                    "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
                                    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
                                    "num_experts": 60}),
    "qwen3_moe": _Decoder(qk_norm="head", sliding="qwen", moe="qwen",
                          defaults={"tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
                                    "sliding_window": 4096, "max_window_layers": 28, "max_position_embeddings": 32768,
                                    "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
                                    "num_experts": 128}),
    "deepseek_v3": _Decoder(out_bias="attention_bias", moe="deepseek",
                            defaults={"tie_word_embeddings": False, "attention_bias": False,
                                      "max_position_embeddings": 4096, "moe_intermediate_size": 2048,
                                      "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
                                      "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
                                      "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                                      "num_nextn_predict_layers": 1}),
    "gpt_oss": _Decoder(sliding="alternate", moe="gpt_oss",
                        defaults={"tie_word_embeddings": False, "attention_bias": True, "head_dim": 64,
                                  "sliding_window": 128, "max_position_embeddings": 131072, "num_local_experts": 128,
                                  "num_experts_per_tok": 4}),
}
DECODER_TYPES = tuple(_DECODERS) + ("gemma3_text",)  # gemma3: the multimodal wrapper around a gemma3_text
# Fields only a mixture-of-experts config has (DBRX keeps its own in `ffn_config`).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_num_experts")

# hidden_act values of the decoders → ModelConfig.activation
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}
_DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "residual_dropout", "resid_pdrop", "embedding_dropout",
                   "embd_pdrop")


def _switch(f: _Fields, setting: str | bool) -> bool:
    return setting if isinstance(setting, bool) else f.bool(setting)


def _activation(f: _Fields, fam: _Decoder) -> str:
    # Gemma 2/3 name it hidden_activation, Falcon activation, the others hidden_act; the first one set wins.
    keys = ("hidden_activation", "hidden_act", "activation")
    key = next((k for k in keys if f.data.get(k) is not None), next((k for k in keys if k in fam.defaults), None))
    act = "silu" if key is None else f.str(key)
    if act == "gelu" and fam.gelu_is_tanh:
        act = "gelu_pytorch_tanh"
    if act not in _ACTIVATIONS:
        raise f.fail(f"field {key!r}: unsupported activation {act!r} (supported: {', '.join(_ACTIVATIONS)})")
    return _ACTIVATIONS[act]


def _sliding_layers(f: _Fields, fam: _Decoder, layers: int, window: int) -> tuple[int, ...]:
    """Blocks that attend through the sliding window: `layer_types` when the file lists them, else the
    family's rule (as its transformers configuration class derives `layer_types`)."""
    kinds = f.data.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers or \
                any(k not in ("sliding_attention", "full_attention") for k in kinds):
            raise f.fail(f"field 'layer_types' must list {layers} of 'sliding_attention' / 'full_attention'")
        chosen = tuple(i for i, k in enumerate(kinds) if k == "sliding_attention")
        return chosen if window else ()
    if not window or not fam.sliding:
        return ()
    if fam.sliding == "qwen":
        if not f.bool("use_sliding_window"):
            return ()
        return tuple(range(f.int("max_window_layers", positive=False), layers))
    if fam.sliding == "alternate":
        return tuple(range(0, layers, 2))
    if fam.sliding == "pattern":
        pattern = f.int("sliding_window_pattern")
        return tuple(i for i in range(layers) if (i + 1) % pattern)
    return tuple(range(layers))


def _pretraining_length(f: _Fields) -> int:
    """max_position_embeddings, or the length before RoPE scaling stretched it."""
    scaling = f.data.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise f.fail(f"field 'rope_scaling' must be an object or null, got {scaling!r}")
    original = (scaling or {}).get("original_max_position_embeddings", f.data.get("original_max_position_embeddings"))
    if original is None:
        return f.int("max_position_embeddings")
    if not isinstance(original, int) or isinstance(original, bool) or original < 1:
        raise f.fail(f"original_max_position_embeddings must be a positive integer, got {original!r}")
    return original


def _falcon_layout(f: _Fields, heads: int) -> tuple[int, bool, bool]:
    """(key/value heads, parallel residual, one shared norm) of a Falcon config (HF FalconDecoderLayer)."""
    if f.bool("alibi"):
        raise f.fail("falcon with alibi=true (ALiBi positions) is not supported")
    if f.bool("apply_residual_connection_post_layernorm", False):
        raise f.fail("falcon with apply_residual_connection_post_layernorm=true is not supported")
    new = f.bool("new_decoder_architecture")
    kv = f.int("num_kv_heads", heads) if new else (1 if f.bool("multi_query") else heads)
    parallel = f.bool("parallel_attn")
    norms = f.int("num_ln_in_parallel_attn", 2 if new else 1) if parallel else 2
    return kv, parallel, parallel and norms == 1


def _index_list(f: _Fields, key: str, layers: int) -> tuple[int, ...]:
    """A list of block indices (null or absent: none)."""
    value = f.data.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < layers
                                          for i in value):
        raise f.fail(f"field {key!r} must be a list of block indices 0..{layers - 1}, got {value!r}")
    return tuple(value)


def _moe_fields(f: _Fields, fam: _Decoder, layers: int) -> dict:
    """ModelConfig's expert (and MLA) fields of an MoE family, as its transformers modeling code builds them."""
    if fam.moe == "deepseek":
        # q_lora_rank null: one full-rank q_proj (DeepSeek-V2-Lite); absent: the class default.
        q_rank = 0 if "q_lora_rank" in f.data and f.data["q_lora_rank"] is None else f.int("q_lora_rank")
        first_dense = f.int("first_k_dense_replace", positive=False)
        shared = f.int("n_shared_experts", 0, positive=False) * f.int("moe_intermediate_size")
        mtp_key = "num_mtp_layers" if "num_mtp_layers" in f.data else "num_nextn_predict_layers"
        fields = dict(experts=f.int("n_routed_experts"), expert_ffn=f.int("moe_intermediate_size"),
                      shared_ffn=shared, moe_layers=tuple(range(first_dense, layers)),
                      q_lora_rank=q_rank, kv_lora_rank=f.int("kv_lora_rank"), qk_rope_dim=f.int("qk_rope_head_dim"),
                      qk_nope_dim=f.int("qk_nope_head_dim", positive=False), v_head_dim=f.int("v_head_dim"),
                      mtp_layers=f.int(mtp_key, 0, positive=False))
    elif fam.moe == "qwen":
        # Qwen2/3-MoE (HF Qwen2MoeDecoderLayer): block i is MoE unless listed in mlp_only_layers, when
        # (i + 1) % decoder_sparse_step == 0; Qwen3-MoE has no shared expert.
        step, dense = f.int("decoder_sparse_step"), _index_list(f, "mlp_only_layers", layers)
        experts = f.int("num_experts", positive=False)
        shared = f.int("shared_expert_intermediate_size", positive=False) if f.model_type == "qwen2_moe" else 0
        fields = dict(experts=experts, expert_ffn=f.int("moe_intermediate_size"), shared_ffn=shared,
                      shared_gate=shared > 0,
                      moe_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
                      if experts else ())
    else:  # mixtral, gpt_oss: every block MoE, experts of intermediate_size
        fields = dict(experts=f.int("num_local_experts"), expert_ffn=f.int("intermediate_size"),
                      moe_layers=tuple(range(layers)))
        if fam.moe == "gpt_oss":  # biased router and experts, a sink logit per head
            fields.update(router_bias=True, expert_bias=True, attn_sinks=True)
    if not fields["moe_layers"]:  # no MoE block (num_experts 0, or every block in mlp_only_layers): dense
        return {k: v for k, v in fields.items() if k in ("q_lora_rank", "kv_lora_rank", "qk_rope_dim",
                                                          "qk_nope_dim", "v_head_dim", "mtp_layers")}
    return {**fields, "experts_per_token": f.int("num_experts_per_tok")}


def _decoder(f: _Fields, name: str) -> ModelConfig:
    family = "gemma3" if f.model_type == "gemma3_text" else f.model_type
    fam = _DECODERS[family]
    f.defaults = fam.defaults
    hidden, heads, layers = f.int("hidden_size"), f.int("num_attention_heads"), f.int("num_hidden_layers")
    extra = _moe_fields(f, fam, layers) if fam.moe else {}
    if family == "deepseek_v3":  # MLA: q/k heads dn + dr wide, no key/value head groups
        head_dim = extra["qk_nope_dim"] + extra["qk_rope_dim"]
    else:
        head_dim = f.int("head_dim", hidden // heads if hidden % heads == 0 else _MISSING)
    if family == "falcon":
        kv, parallel, shared = _falcon_layout(f, heads)
    elif family == "deepseek_v3":
        kv, parallel, shared = 0, False, False
    else:
        kv = f.int("num_key_value_heads", heads)
        parallel = fam.parallel_residual == "always" or bool(fam.parallel_residual) and f.bool(fam.parallel_residual)
        shared = parallel and fam.shared_norm
    window = f.optional_int("sliding_window")
    sliding = _sliding_layers(f, fam, layers, window)
    window = window if sliding else 0  # Qwen's window is off unless use_sliding_window
    qk_norm = fam.qk_norm if fam.qk_norm and (not fam.qk_norm_field or f.bool(fam.qk_norm_field)) else ""
    return ModelConfig(
        name=name, family=family, layers=layers, hidden=hidden, heads=heads, kv_heads=kv,
        ffn=f.int("ffn_hidden_size", 4 * hidden) if family == "falcon" else f.int("intermediate_size"),
        vocab=f.int("vocab_size"), max_seq=_pretraining_length(f), gated_mlp=fam.gated, norm=fam.norm,
        norm_bias=fam.norm_bias, bias=_switch(f, fam.qkv_bias) and _switch(f, fam.out_bias) and
        _switch(f, fam.mlp_bias), qkv_bias=_switch(f, fam.qkv_bias), out_bias=_switch(f, fam.out_bias),
        mlp_bias=_switch(f, fam.mlp_bias), learned_positions=False, tied_embeddings=f.bool("tie_word_embeddings"),
        kv_channels=0 if head_dim * heads == hidden else head_dim, activation=_activation(f, fam),
        dropout=any(isinstance(f.data.get(k), (int, float)) and f.data[k] > 0 for k in _DROPOUT_FIELDS),
        qk_norm=qk_norm, block_norms=fam.block_norms, parallel_residual=parallel, shared_norm=shared,
        rotary_fraction=f.fraction(fam.rotary_field, 1.0), sliding_window=window,
        sliding_layers=sliding,
        attn_softcap=f.optional_number("attn_logit_softcapping"),
        logit_softcap=f.optional_number("final_logit_softcapping"), **extra)


_OTHER_TYPES = {"gpt2": "learned positions, LayerNorm, GeLU MLP, biases, tied embeddings",
                "bert": "encoder, learned positions and token types, masked-LM head",
                "t5": "encoder-decoder, relative position buckets, RMSNorm, ReLU or gated-GeLU MLP",
                "vit": "vision: patch embedding, class token, classifier head",
                "swin": "vision: shifted-window attention stages, patch merging"}


def _describe(fam: _Decoder) -> str:
    parts = [f"{'RMSNorm' if fam.norm == 'rmsnorm' else 'LayerNorm' + ('' if fam.norm_bias else ' without bias')}",
             "gated MLP" if fam.gated else "plain MLP", "RoPE"]
    if fam.qkv_bias is True and fam.out_bias is False:
        parts.append("q/k/v biases")
    if fam.qk_norm:
        parts.append(f"q/k norms ({fam.qk_norm})" + (f" if {fam.qk_norm_field}" if fam.qk_norm_field else ""))
    if fam.block_norms != "pre":
        parts.append(f"{fam.block_norms} norms")
    if fam.parallel_residual:
        parts.append("parallel residual" + (" (one norm)" if fam.shared_norm else "")
                     + (f" if {fam.parallel_residual}" if fam.parallel_residual != "always" else ""))
    if fam.sliding:
        parts.append(f"sliding window ({fam.sliding})")
    if fam.moe:
        parts.append(_MOE_NOTES[fam.moe])
    return ", ".join(parts)


_MOE_NOTES = {"mixtral": "MoE in every block",
              "qwen": "MoE blocks by decoder_sparse_step / mlp_only_layers (+ gated shared expert in qwen2_moe)",
              "deepseek": "MLA, MoE from first_k_dense_replace on, shared experts, MTP not built",
              "gpt_oss": "MoE with biased router and experts, attention sinks"}


def model_types() -> list[dict]:
    """Each model_type a config.json may have: the family it becomes and what that family implies."""
    rows = [{"model_type": t, "family": t, "implies": note} for t, note in _OTHER_TYPES.items()]
    rows += [{"model_type": t, "family": t, "implies": _describe(fam)} for t, fam in _DECODERS.items()]
    rows.append({"model_type": "gemma3_text", "family": "gemma3", "implies": "the text decoder of gemma3"})
    return rows


_READERS = {"gpt2": _gpt2, "bert": _bert, "t5": _t5, "vit": _vit, "swin": _swin,
            **{t: _decoder for t in DECODER_TYPES}}
MODEL_TYPES = tuple(_READERS)


def _is_moe(data: dict) -> bool:
    """A config with experts: one of MOE_KEYS at the top or in a nested object (DBRX's ffn_config)."""
    nested = [v for v in data.values() if isinstance(v, dict)]
    return any(key in d and d[key] for d in [data] + nested for key in MOE_KEYS)


def read_hf_config(path: str | Path) -> ModelConfig:
    """Read a Hugging Face config.json (or a folder holding one) into a ModelConfig."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    return read_hf_dict(read_json_object(path, "model config"), path)


def read_hf_dict(data: dict, path: str | Path) -> ModelConfig:
    """A Hugging Face config as a dict (a config.json's content, or `PretrainedConfig.to_dict()`) → ModelConfig;
    `path` names where it came from in errors (and gives the name when the config has no `_name_or_path`)."""
    path = Path(path)
    model_type = data.get("model_type")
    if model_type is None:
        raise UniapError(f"{path}: missing field 'model_type' (one of {', '.join(MODEL_TYPES)})")
    if model_type not in _READERS:
        if _is_moe(data):
            raise UniapError(f"{path}: unsupported mixture-of-experts model_type {model_type!r} (MoE types read: "
                             f"{', '.join(t for t, fam in _DECODERS.items() if fam.moe)})")
        raise UniapError(f"{path}: unsupported model_type {model_type!r} (supported: {', '.join(MODEL_TYPES)})")
    name = _model_name(data, path)
    if model_type == "gemma3":  # Gemma 3 4B and up: a vision tower + a gemma3_text decoder; uniap plans the decoder
        data = data.get("text_config")
        if not isinstance(data, dict):
            raise UniapError(f"{path}: model_type 'gemma3' needs a 'text_config' object (its language model)")
    f = _Fields(data, path, model_type)
    config = _READERS[model_type](f, name)
    try:
        check_config(config)
    except UniapError as exc:
        raise UniapError(f"{path}: {exc}") from None
    return config


def zoo_hf_config(config: ModelConfig) -> dict:
    """The Hugging Face config of a plain GPT-2 or Llama architecture (the zoo's gpt2 and llama families), which
    `read_hf_dict` reads back to the same architecture, so that `uniap run --impl transformers` can build its class
    and the demo can write a config.json; no dropout, as the runtime trains (`models/decoder.as_trained`)."""
    if config.family == "gpt2" and not config.kv_channels and not config.gated_mlp and config.norm == "layernorm" \
            and config.bias and config.learned_positions:
        return {"model_type": "gpt2", "n_layer": config.layers, "n_embd": config.hidden, "n_head": config.heads,
                "n_inner": config.ffn, "vocab_size": config.vocab, "n_positions": config.max_seq,
                "tie_word_embeddings": config.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
                "attn_pdrop": 0.0}
    if config.family == "llama" and config.gated_mlp and config.norm == "rmsnorm" and not config.bias \
            and not config.kv_channels and not config.learned_positions:
        return {"model_type": "llama", "hidden_size": config.hidden, "num_hidden_layers": config.layers,
                "num_attention_heads": config.heads, "num_key_value_heads": config.n_kv_heads,
                "intermediate_size": config.ffn, "vocab_size": config.vocab, "max_position_embeddings": config.max_seq,
                "tie_word_embeddings": config.tied_embeddings, "rms_norm_eps": 1e-5}
    raise UniapError(f"{config.name} ({config.family}) carries no Hugging Face config: plan it from its config.json "
                     f"to run it on transformers")
