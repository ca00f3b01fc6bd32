"""Hugging Face `config.json` → ModelConfig, for model_type gpt2, llama, bert, t5, vit and swin.

Field names and defaults are those of the transformers configuration classes (GPT2Config, LlamaConfig,
BertConfig, T5Config, ViTConfig, SwinConfig): a field the class defaults is optional here with the same
default; a field that defines the architecture's size is required. Every problem is one UniapError line
naming the file.
"""

from __future__ import annotations

from pathlib import Path

from uniap.errors import UniapError
from uniap.jsonfile import read_json_object
from uniap.spec.families import check_config
from uniap.spec.model import ModelConfig

MODEL_TYPES = ("gpt2", "llama", "bert", "t5", "vit", "swin")
_MISSING = object()


class _Fields:
    """Typed access to the JSON object, with errors that name the file and the field."""

    def __init__(self, data: dict, path: Path, model_type: str):
        self.data, self.path, self.model_type = data, path, model_type

    def fail(self, problem: str) -> UniapError:
        return UniapError(f"{self.path}: {problem}")

    def _get(self, key: str, default):
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


def _llama(f: _Fields, name: str) -> ModelConfig:
    hidden, heads = f.int("hidden_size"), f.int("num_attention_heads")
    head_dim = f.int("head_dim", hidden // heads if hidden % heads == 0 else _MISSING)
    return ModelConfig(
        name=name, family="llama", layers=f.int("num_hidden_layers"), hidden=hidden, heads=heads,
        kv_heads=f.int("num_key_value_heads", heads), ffn=f.int("intermediate_size"), vocab=f.int("vocab_size"),
        max_seq=f.int("max_position_embeddings", 2048), gated_mlp=True, norm="rmsnorm",
        bias=f.bool("attention_bias", False), learned_positions=False,
        tied_embeddings=f.bool("tie_word_embeddings", False),
        kv_channels=0 if head_dim * heads == hidden else head_dim)


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


_READERS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "t5": _t5, "vit": _vit, "swin": _swin}


def read_hf_config(path: str | Path) -> ModelConfig:
    """Read a Hugging Face config.json (or a folder holding one) into a ModelConfig."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = read_json_object(path, "model config")
    model_type = data.get("model_type")
    if model_type is None:
        raise UniapError(f"{path}: missing field 'model_type' (one of {', '.join(MODEL_TYPES)})")
    if model_type not in _READERS:
        raise UniapError(f"{path}: unsupported model_type {model_type!r} (supported: {', '.join(MODEL_TYPES)})")
    f = _Fields(data, path, model_type)
    config = _READERS[model_type](f, _model_name(data, path))
    try:
        check_config(config)
    except UniapError as exc:
        raise UniapError(f"{path}: {exc}") from None
    return config
