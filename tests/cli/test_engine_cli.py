"""The engine setting (`--kernels`, `--attention`, YAML `kernels:`/`attention:`) and memory units, as a user meets them."""

import json

import pytest

from uniap.spec.cluster import GiB, MiB, load_cluster

BASE = ["estimate", "--model", "llama2-7b", "--cluster", "a100-80g:1x8", "--global-batch", "64", "--seq-len", "2048",
        "--dp", "8", "--zero", "3"]


def test_engine_is_recorded_changes_costs_and_survives_recost(cli, cli_json, tmp_path):
    eager = cli_json(*BASE)
    fused = cli_json(*BASE, "--kernels", "fused")
    standard = cli_json(*BASE, "--attention", "standard")
    assert eager["cluster"]["engine"] == {"kernels": "eager", "attention": "flash"}
    assert fused["cluster"]["engine"] == {"kernels": "fused", "attention": "flash"}
    assert standard["cluster"]["engine"] == {"kernels": "eager", "attention": "standard"}
    assert fused["predicted"]["iteration_time_s"] < eager["predicted"]["iteration_time_s"]
    # standard attention keeps the score matrix: more memory, and more time
    assert max(standard["predicted"]["peak_memory_bytes"]) > max(eager["predicted"]["peak_memory_bytes"])
    assert standard["predicted"]["iteration_time_s"] > eager["predicted"]["iteration_time_s"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(fused))
    again = cli_json("estimate", "--plan", str(path))  # re-costed under the engine the plan records
    assert again["predicted"]["iteration_time_s"] == pytest.approx(fused["predicted"]["iteration_time_s"], rel=1e-12)
    assert "engine: fused kernels, flash attention" in cli("estimate", "--plan", str(path)).stdout


def test_bad_engine_values_are_one_line(cli, tmp_path):
    proc = cli(*BASE, "--kernels", "triton", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("nodes: 1\ndevices_per_node: 8\nkernels: jit\n")
    proc = cli(*BASE[:3], "--cluster", str(yaml_file), *BASE[5:], check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "unknown kernels 'jit'" in proc.stderr


def test_yaml_engine_and_memory_units(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text("nodes: 1\ndevices_per_node: 8\nmemory_gib: 36\nkernels: fused\nattention: standard\n")
    cluster = load_cluster(str(path))
    assert cluster.device.memory_bytes == 36 * GiB  # Galvatron's "36 GB": 36,864 MiB
    assert (cluster.engine.kernels, cluster.engine.attention) == ("fused", "standard")
    path.write_text("nodes: 1\ndevices_per_node: 8\nmemory_gb: 36\n")
    assert load_cluster(str(path)).device.memory_bytes == 36e9
    assert load_cluster(str(path)).engine == load_cluster("a100-80g:1x8").engine  # the preset's default
    path.write_text("nodes: 1\ndevices_per_node: 8\nmemory_gb: 36\nmemory_gib: 36\n")
    with pytest.raises(Exception, match="not both"):
        load_cluster(str(path))


def test_presets_state_memory_as_the_driver_reports_it():
    assert load_cluster("a100-80g:1x8").device.memory_bytes == 81920 * MiB
    assert load_cluster("h100-80g:1x8").device.memory_bytes == 81559 * MiB
    # no flash kernel before sm80: V100 and TITAN Xp default to standard attention
    assert load_cluster("v100-32g:1x8").engine.attention == "standard"
    assert load_cluster("a100-40g:1x8").engine.attention == "flash"


def test_predicted_mfu_stays_within_published_reach(cli_json):
    """Best published MFU on A100 is ~65 % (llm-foundry MPT-7B on 8 A100, benchmarks/data); on H100 ~47 %
    (llm-foundry MPT-7B on 8 H100). A prediction may not exceed them by more than 10 points."""
    for cluster, best in (("a100-80g:1x8", 0.65), ("h100-80g:1x8", 0.47)):
        for kernels in ("eager", "fused"):
            plan = cli_json("plan", "--model", "llama2-7b", "--cluster", cluster, "--global-batch", "64",
                            "--seq-len", "2048", "--kernels", kernels)
            assert plan["predicted"]["mfu"] <= best + 0.10, (cluster, kernels, plan["predicted"]["mfu"])
