"""Conventions: `uniap --version`, `uniap models` listing the config.json model types next to the zoo, the
precision default that follows the device, and every Hugging Face decoder family planning on 8 A100s."""

import json
from pathlib import Path

import pytest

from typer.testing import CliRunner

from uniap import __version__
from uniap.cli import app
from uniap.commands.options import Precision, resolve_precision
from uniap.planner import plan_search
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.hf import MODEL_TYPES
from uniap.spec.workload import Workload

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
ONE_PER_FAMILY = ["llama3.1-8b", "mistral-7b-v0.1", "qwen2.5-7b", "qwen3-8b", "gemma-7b", "gemma-2-9b", "gemma-3-4b",
                  "phi-3-mini-4k", "pythia-1.4b", "falcon-7b", "olmo-2-1124-7b", "starcoder2-7b", "c4ai-command-r-v01"]


def invoke(*args: str):
    """In process (typer's runner): these commands only print."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_version():
    assert invoke("--version").strip() == f"uniap {__version__}"


def test_models_lists_zoo_and_config_model_types():
    listing = json.loads(invoke("models", "--format", "json"))
    assert {r["model_type"] for r in listing["config_model_types"]} == set(MODEL_TYPES)
    assert "llama3-8b" in {r["name"] for r in listing["models"]}
    falcon = next(r for r in listing["config_model_types"] if r["model_type"] == "falcon")
    assert "parallel residual" in falcon["implies"]
    text = invoke("models")
    assert "starcoder2" in text and "model zoo" in text


@pytest.mark.parametrize("preset, precision", [("a100-80g", "bf16"), ("h100-80g", "bf16"), ("v100-32g", "fp16"),
                                               ("titanxp-12g", "fp32"), ("cpu", "fp32")])
def test_precision_defaults_to_the_device_fastest(preset, precision):
    cluster = load_cluster(f"{preset}:1x2")
    assert resolve_precision(None, cluster) == precision
    assert resolve_precision(Precision.fp16, cluster) == "fp16"  # a flag is kept (and checked when costed)


def test_compare_on_titan_xp_runs_without_a_precision_flag(cli):
    proc = cli("compare", "--model", "gpt2", "--cluster", "titanxp-12g:1x8", "--global-batch", "8",
               "--methods", "dp", "--format", "json")
    assert json.loads(proc.stdout)["workload"]["precision"] == "fp32"


@pytest.mark.parametrize("folder", ONE_PER_FAMILY)
def test_every_decoder_family_plans(folder):
    # 8192 tokens: the sliding windows of Mistral, Gemma 2/3, Phi-3 and StarCoder2 bind.
    model = load_model(str(DATA / folder), seq_len=8192)
    plan = plan_search(model, load_cluster("a100-80g:1x8"), Workload(16, 8192, "bf16"), time_limit=20)
    assert plan.model.parameters == model.parameters
    assert plan.predicted["fits"] and plan.predicted["iteration_time_s"] > 0
