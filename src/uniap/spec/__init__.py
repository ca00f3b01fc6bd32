"""Model specs: what a model is to the planner (a chain of layers with parameters, FLOPs, activations).

    load_model("gpt2")                      a zoo preset at its default sequence length
    load_model("llama2-7b", seq_len=2048)   … at another length
    load_model("path/to/config.json")       a Hugging Face config (or a folder holding config.json)
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from pathlib import Path

from uniap.errors import UniapError
from uniap.spec.families import build_layers
from uniap.jsonfile import read_json_object
from uniap.spec.hf import read_hf_config, read_hf_dict
from uniap.spec.model import LayerSpec, ModelConfig, ModelSpec
from uniap.spec.zoo import ZOO

__all__ = ["LayerSpec", "ModelConfig", "ModelSpec", "build_layers", "load_model", "read_hf_config",
           "zoo_config", "zoo_names"]


def zoo_names() -> list[str]:
    """Names of the preset models, grouped by family as the zoo lists them."""
    return list(ZOO)


def _unknown(name: str) -> UniapError:
    near = difflib.get_close_matches(name, list(ZOO), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else f"; known: {', '.join(ZOO)}"
    return UniapError(f"unknown model {name!r} (not a zoo name nor a config.json path){hint}")


def zoo_config(name: str) -> ModelConfig:
    """The preset ModelConfig called `name`."""
    try:
        return ZOO[name]
    except (KeyError, TypeError):
        raise _unknown(str(name)) from None


def load_model(name_or_path: str | Path | dict, seq_len: int | None = None) -> ModelSpec:
    """A zoo name, a path to a Hugging Face config.json (or its folder), or such a config as a dict → ModelSpec.
    A Hugging Face config is kept on the spec (`ModelSpec.hf_config`).

    seq_len None: the config's default (`max_seq`). Longer than the learned position table of a
    GPT-2/BERT-style model: UniapError. Vision models take their token count from the image and patch
    sizes and ignore seq_len.
    """
    hf = None
    if isinstance(name_or_path, dict):
        hf = name_or_path
        config = read_hf_dict(hf, str(hf.get("_name_or_path") or "config"))
    elif str(name_or_path) in ZOO:
        config = ZOO[str(name_or_path)]
    else:
        key = str(name_or_path)
        path = Path(key).expanduser()
        if path.exists():
            config = read_hf_config(path)
            hf = read_json_object(path / "config.json" if path.is_dir() else path, "model config")
        elif key.endswith(".json") or "/" in key or "\\" in key:
            raise UniapError(f"{key}: no such file or folder")
        else:
            raise _unknown(key)
    if hf is not None and hf.get("model_type") == "gemma3":  # the multimodal wrapper: its language model
        hf = {"model_type": "gemma3_text", **hf["text_config"]}
    spec = build_layers(config, config.max_seq if seq_len is None else seq_len)
    return replace(spec, hf_config=hf) if hf is not None else spec
