"""The levers from the command line: `estimate --recompute selective --cp`, the plan JSON naming them, and fp8
refused in one line on a device without fp8 GEMMs."""

import pytest


def test_estimate_names_the_recompute_level_and_cp(cli_json):
    plan = cli_json("estimate", "--model", "llama3-8b", "--cluster", "h100-80g:1x8", "--global-batch", "8",
                    "--seq-len", "32768", "--cp", "4", "--zero", "1", "--recompute", "selective",
                    "--attention", "standard")
    blocks = [layer["strategy"] for layer in plan["layers"] if layer["name"].startswith("block.")]
    assert all(s["recompute"] == "selective" and s["cp"] == 4 and s["dp"] == 2 for s in blocks)
    edges = [layer["strategy"] for layer in plan["layers"] if layer["name"] in ("embed", "head")]
    assert all(s["recompute"] == "none" and s["cp"] == 4 for s in edges)  # no attention core to recompute


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_fp8_without_fp8_gemms_is_one_line(cli, command):
    proc = cli(command, "--model", "gpt3-1.3b", "--cluster", "a100-80g:1x8", "--global-batch", "8",
               "--precision", "fp8", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "no fp8 GEMMs" in proc.stderr


def test_fp8_plans_on_h100(cli_json):
    fp8 = cli_json("estimate", "--model", "llama3-8b", "--cluster", "h100-80g:1x8", "--global-batch", "16",
                   "--zero", "3", "--precision", "fp8")
    bf16 = cli_json("estimate", "--model", "llama3-8b", "--cluster", "h100-80g:1x8", "--global-batch", "16",
                    "--zero", "3", "--precision", "bf16")
    assert fp8["workload"]["precision"] == "fp8"
    assert fp8["predicted"]["iteration_time_s"] < bf16["predicted"]["iteration_time_s"]
