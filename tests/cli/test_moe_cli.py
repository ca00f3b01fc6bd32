"""Mixtures of experts from the command line: `estimate --ep/--etp`, `plan` choosing ep, the plan JSON carrying it."""

import json
from pathlib import Path

import pytest

MIXTRAL = str(Path(__file__).resolve().parents[1] / "data" / "hf" / "mixtral-8x7b" / "config.json")


def test_estimate_places_the_experts_and_prices_the_exchange(cli_json):
    base = ["estimate", "--model", MIXTRAL, "--cluster", "h100-80g:2x8", "--global-batch", "64", "--seq-len", "4096",
            "--pp", "2", "--zero", "1"]
    ep1, ep8 = cli_json(*base), cli_json(*base, "--ep", "8")
    blocks = [layer for layer in ep8["layers"] if layer["name"].startswith("block.")]
    assert {json.dumps(layer["strategy"], sort_keys=True) for layer in blocks} == \
        {json.dumps({"dp": 8, "tp": 1, "zero": 1, "recompute": "none", "sp": False, "ep": 8}, sort_keys=True)}
    edges = [layer for layer in ep8["layers"] if layer["name"] in ("embed", "head")]
    assert all("ep" not in layer["strategy"] for layer in edges)  # dense layers keep their dp × tp alone
    # Stage 0 holds 16 MoE blocks of 8 experts (1,409,286,144 parameters each). ep 1: every device holds all of
    # them, ZeRO-1 over dp 8 (2 + 2 + 12/8 B per parameter); ep 8: one expert each, edp 1 (16 B per parameter).
    # Activations do not depend on ep (dispatch spreads the tokens either way).
    saved = 16 * 1_409_286_144 * ((2 + 2 + 12 / 8) - 16 / 8)
    first = [run["predicted"]["peak_memory_bytes"][0] for run in (ep1, ep8)]
    assert first[0] - first[1] == pytest.approx(saved, rel=1e-9)


def test_ep_on_a_dense_model_or_not_dividing_is_one_line(cli):
    proc = cli("estimate", "--model", "llama2-7b", "--cluster", "a100-80g:1x8", "--global-batch", "16",
               "--ep", "2", check=False)
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0
    assert "has none" in proc.stderr
    proc = cli("estimate", "--model", MIXTRAL, "--cluster", "h100-80g:2x8", "--global-batch", "64",
               "--seq-len", "4096", "--ep", "16", check=False)
    assert proc.returncode != 0 and "ep 16 does not divide the 8 experts" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_plan_searches_ep_and_recosts_the_same(cli, cli_json, tmp_path):
    out = tmp_path / "moe.json"
    plan = cli_json("plan", "--model", MIXTRAL, "--cluster", "h100-80g:2x8", "--global-batch", "64", "--seq-len",
                    "4096", "--out", str(out))
    assert plan["search"]["optimal"] is True
    moe = [layer["strategy"] for layer in plan["layers"] if layer["name"].startswith("block.")]
    assert any(s.get("ep", 1) > 1 for s in moe)  # replicating 8 experts of 14336 does not fit 80 GB
    again = cli_json("estimate", "--plan", str(out))
    assert again["predicted"]["iteration_time_s"] == pytest.approx(plan["predicted"]["iteration_time_s"], rel=1e-12)
    html = tmp_path / "report.html"
    cli("report", str(out), "--out", str(html))
    eps = {s["ep"] for s in moe if s.get("ep", 1) > 1}
    assert all(f"ep{ep}" in html.read_text() for ep in eps)  # the strategy map names the expert layout


def test_engine_search_and_export_carry_the_expert_layout(cli, cli_json, tmp_path):
    """`plan --engine megatron` on Mixtral keeps to Megatron's expert layouts, and its export sets them."""
    out = tmp_path / "mixtral.json"
    plan = cli_json("plan", "--model", MIXTRAL, "--cluster", "h100-80g:2x8", "--global-batch", "64", "--seq-len",
                    "4096", "--engine", "megatron", "--out", str(out))
    moe = {json.dumps(layer["strategy"], sort_keys=True) for layer in plan["layers"]
           if layer["name"].startswith("block.")}
    assert len(moe) == 1  # one expert layout for every MoE block, as Megatron's flags set it
    strategy = json.loads(moe.pop())
    assert strategy["tp"] == 1 or strategy["sp"]  # MoE with tp needs sequence parallelism there
    flags = cli("export", str(out), "--to", "megatron").stdout
    assert "--num-experts 8" in flags and "--moe-router-topk 2" in flags
    assert f"--expert-model-parallel-size {strategy.get('ep', 1)}" in flags
    proc = cli("export", str(out), "--to", "deepspeed", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_torchtitan_builds_qwen3_moe_from_its_own_flavor(cli, cli_json, tmp_path):
    """The qwen3_moe config.json is torchtitan's qwen3 30B-A3B flavor; the plan's ep becomes expert_parallel_degree."""
    qwen = str(Path(__file__).resolve().parents[1] / "data" / "hf" / "qwen3-30b-a3b" / "config.json")
    out = tmp_path / "qwen.json"
    plan = cli_json("plan", "--model", qwen, "--cluster", "h100-80g:2x8", "--global-batch", "64", "--seq-len", "4096",
                    "--engine", "torchtitan", "--out", str(out))
    ep = max(layer["strategy"].get("ep", 1) for layer in plan["layers"])
    toml = cli("export", str(out), "--to", "torchtitan").stdout
    assert 'flavor = "30B-A3B"' in toml and f"expert_parallel_degree = {ep}" in toml
