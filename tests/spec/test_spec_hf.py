"""Hugging Face config.json reading: round trips against the zoo, field mapping, one-line errors."""

import dataclasses
import json
from pathlib import Path

import pytest

from uniap.errors import UniapError
from uniap.spec import load_model, read_hf_config, zoo_config, zoo_names
from uniap.spec.hf import MODEL_TYPES

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
FIXTURES = sorted(p.name for p in DATA.iterdir() if (p / "config.json").is_file())
ZOO_FIXTURES = [name for name in FIXTURES if name in zoo_names()]  # the others: tests/spec/test_spec_hf_decoders.py


def test_every_model_type_has_a_fixture():
    types = {json.loads((DATA / name / "config.json").read_text())["model_type"] for name in FIXTURES}
    assert types == set(MODEL_TYPES)


@pytest.mark.parametrize("folder", ZOO_FIXTURES)
def test_fixture_round_trips_to_the_zoo_preset(folder):
    # Each fixture is the public config.json of the checkpoint the preset describes; the folder is
    # named after the preset, and the model is named after its folder.
    config = read_hf_config(DATA / folder / "config.json")
    assert config == zoo_config(folder)
    spec = load_model(str(DATA / folder))  # a folder holding config.json works too
    assert spec.config == config and spec.parameters == load_model(folder).parameters
    assert [layer.signature for layer in spec.layers] == [layer.signature for layer in load_model(folder).layers]


def write(tmp_path: Path, data, folder: str = "model") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def gpt2_json(**change):
    data = json.loads((DATA / "gpt2" / "config.json").read_text())
    data.update(change)
    return {k: v for k, v in data.items() if v is not ...}


def test_name_from_name_or_path(tmp_path):
    assert read_hf_config(write(tmp_path, gpt2_json(_name_or_path="openai-community/gpt2"))).name == \
        "openai-community/gpt2"
    assert read_hf_config(write(tmp_path, gpt2_json(_name_or_path="/models/my-gpt/"))).name == "my-gpt"
    assert read_hf_config(write(tmp_path, gpt2_json(), folder="folder-name")).name == "folder-name"


def test_gpt2_defaults_and_n_inner(tmp_path):
    cfg = read_hf_config(write(tmp_path, gpt2_json(n_inner=None, n_positions=..., tie_word_embeddings=...)))
    assert (cfg.ffn, cfg.max_seq, cfg.tied_embeddings) == (4 * 768, 1024, True)
    cfg = read_hf_config(write(tmp_path, gpt2_json(n_inner=1000, tie_word_embeddings=False)))
    assert cfg.ffn == 1000 and not cfg.tied_embeddings


def test_llama_gqa_and_head_dim(tmp_path):
    data = json.loads((DATA / "llama3-8b" / "config.json").read_text())
    cfg = read_hf_config(write(tmp_path, data))
    assert (cfg.kv_heads, cfg.n_kv_heads, cfg.gated_mlp, cfg.norm, cfg.bias, cfg.learned_positions) == \
        (8, 8, True, "rmsnorm", False, False)
    del data["num_key_value_heads"]
    assert read_hf_config(write(tmp_path, data)).kv_heads == 32
    data["head_dim"] = 256  # wider heads than hidden / heads
    assert read_hf_config(write(tmp_path, data)).head_dim == 256


def test_t5_gated_and_d_kv(tmp_path):
    data = json.loads((DATA / "t5-large" / "config.json").read_text())
    data.update(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=6)
    cfg = read_hf_config(write(tmp_path, data))
    assert cfg.gated_mlp and not cfg.tied_embeddings and cfg.decoder_layers == 6
    data.update(d_model=1024, d_kv=128, num_heads=32)  # T5-3B shape: 32 heads × 128 != 1024
    cfg = read_hf_config(write(tmp_path, data))
    assert cfg.head_dim == 128 and cfg.kv_channels == 128
    data["feed_forward_proj"] = "fancy-gelu"
    with pytest.raises(UniapError, match="feed_forward_proj"):
        read_hf_config(write(tmp_path, data))


def test_vision_fields(tmp_path):
    data = json.loads((DATA / "vit-huge-14" / "config.json").read_text())
    data["id2label"] = {str(i): f"c{i}" for i in range(10)}
    cfg = read_hf_config(write(tmp_path, data))
    assert cfg.num_classes == 10 and cfg.max_seq == 257
    data = json.loads((DATA / "swin-huge" / "config.json").read_text())
    data["num_heads"] = [8, 16, 24, 64]
    with pytest.raises(UniapError, match="must double"):
        read_hf_config(write(tmp_path, data))
    data["num_heads"] = [8, 16, 32]
    with pytest.raises(UniapError, match="4 stages but 'num_heads' has 3"):
        read_hf_config(write(tmp_path, data))


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"n_layer": 2}), "missing field 'model_type'"),
    (json.dumps({"model_type": "mamba"}), "unsupported model_type 'mamba'"),
    (json.dumps(gpt2_json(n_layer=...)), "missing field 'n_layer' for model_type 'gpt2'"),
    (json.dumps(gpt2_json(n_head="12")), "'n_head' must be a positive integer"),
    (json.dumps(gpt2_json(n_layer=0)), "'n_layer' must be a positive integer"),
    (json.dumps(gpt2_json(n_head=7)), "not a multiple of 7 heads"),
    (json.dumps(gpt2_json(tie_word_embeddings="yes")), "must be true or false"),
])
def test_bad_configs_raise_one_line_naming_the_file(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(UniapError, match=message) as exc:
        read_hf_config(path)
    text = str(exc.value)
    assert str(path) in text and "\n" not in text


def test_missing_files(tmp_path):
    with pytest.raises(UniapError, match="no such file"):
        read_hf_config(tmp_path / "nothing.json")
    with pytest.raises(UniapError, match="config.json: no such file"):
        load_model(str(tmp_path))  # a folder without config.json
    with pytest.raises(UniapError, match="no such file or folder"):
        load_model(str(tmp_path / "absent" / "config.json"))


def test_load_model_seq_len_from_a_config(tmp_path):
    path = write(tmp_path, gpt2_json(n_positions=256))
    assert load_model(str(path)).seq_len == 256
    with pytest.raises(UniapError, match="exceeds the 256 learned positions"):
        load_model(str(path), seq_len=512)
    assert dataclasses.replace(read_hf_config(path), name="gpt2", max_seq=1024) == zoo_config("gpt2")
