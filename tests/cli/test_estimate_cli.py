"""`uniap estimate`: the JSON contract, the fit check, and one clear line for every kind of bad input."""

import json

import pytest

LLAMA = ["estimate", "--model", "llama2-7b", "--cluster", "a100-80g:1x8", "--global-batch", "512", "--seq-len", "4096",
         "--precision", "bf16", "--tp", "1", "--pp", "1", "--dp", "8", "--zero", "3", "--micro-batch-size", "1"]


def test_estimate_prints_the_plan_contract(cli_json):
    plan = cli_json(*LLAMA)
    assert plan["schema"] == "uniap.plan/1"
    assert plan["model"]["name"] == "llama2-7b" and plan["model"]["layers"] == 34
    assert abs(plan["model"]["parameters"] - 6.74e9) / 6.74e9 < 0.01
    assert plan["cluster"] == {"name": "a100-80g:1x8", "devices": 8, "nodes": 1, "devices_per_node": 8,
                               "engine": {"kernels": "eager", "attention": "flash"}}
    assert plan["workload"] == {"global_batch": 512, "seq_len": 4096, "precision": "bf16",
                                "expert_imbalance": 1.1}
    assert plan["pipeline"] == {"degree": 1, "micro_batches": 64, "schedule": "1f1b", "virtual_stages": 1}
    assert plan["stages"] == [{"index": 0, "ranks": list(range(8)), "layers": [0, 33], "chunks": [[0, 33]]}]
    assert {json.dumps(l["strategy"], sort_keys=True) for l in plan["layers"]} == {
        json.dumps({"dp": 8, "tp": 1, "zero": 3, "recompute": "none", "sp": False}, sort_keys=True)}
    pred = plan["predicted"]
    for key in ("iteration_time_s", "samples_per_s", "tokens_per_s", "model_tflops_per_device", "mfu"):
        assert isinstance(pred[key], float) and pred[key] > 0
    assert pred["samples_per_s"] == pytest.approx(512 / pred["iteration_time_s"])
    assert pred["tokens_per_s"] == pytest.approx(512 * 4096 / pred["iteration_time_s"])
    assert 0 < pred["mfu"] < 1
    assert len(pred["peak_memory_bytes"]) == 1 and isinstance(pred["fits"], bool)


def test_estimate_table_and_plan_recost_agree(cli, cli_json, tmp_path):
    args = ["estimate", "--model", "gpt3-1.3b", "--cluster", "a100-40g:2x8", "--global-batch", "64", "--tp", "2",
            "--pp", "2", "--zero", "1", "--recompute", "full", "--schedule", "gpipe"]
    plan = cli_json(*args)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    again = cli_json("estimate", "--plan", str(path))
    assert again["predicted"]["iteration_time_s"] == pytest.approx(plan["predicted"]["iteration_time_s"], rel=1e-12)
    text = cli(*args).stdout
    assert "iteration time" in text and "fits" in text


def test_configuration_that_does_not_fit_says_by_how_much(cli, cli_json):
    args = ["estimate", "--model", "llama2-70b", "--cluster", "a100-40g:1x8", "--global-batch", "8", "--dp", "8"]
    plan = cli_json(*args)
    assert plan["predicted"]["fits"] is False
    proc = cli(*args)
    assert proc.returncode == 0 and "does NOT fit" in proc.stdout and "over by" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "llama9-1b", "--cluster", "a100-80g:1x8", "-b", "8"], "unknown model"),
    (["--model", "gpt2", "--cluster", "b200:1x8", "-b", "8"], "unknown cluster preset"),
    (["--model", "gpt2", "--cluster", "a100-80g:1x8", "-b", "8", "--tp", "8"], "does not divide 12"),
    (["--model", "gpt2", "--cluster", "a100-80g:1x8", "-b", "8", "--tp", "2", "--pp", "2", "--dp", "3"], "dp·tp·pp"),
    (["--model", "gpt2", "--cluster", "a100-80g:1x8", "-b", "12", "--dp", "8"], "does not split"),
    (["--model", "gpt2", "--cluster", "a100-80g:1x8", "-b", "8", "--pp", "16", "--dp", "1", "--tp", "1"], "dp·tp·pp"),
    (["--model", "gpt2", "--cluster", "v100-32g:1x8", "-b", "8", "--precision", "bf16"], "no bf16"),
    (["--model", "gpt2", "--cluster", "a100-80g:1x8", "-b", "8", "--seq-len", "4096"], "position"),
    (["--model", "gpt2", "--cluster", "a100-80g:1x8"], "--global-batch"),
])
def test_bad_input_gives_one_line_and_nonzero_exit(cli, args, message):
    proc = cli("estimate", *args, check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert message in lines[0]


def test_malformed_files_give_one_line(cli, tmp_path):
    bad_json = tmp_path / "config.json"
    bad_json.write_text("{not json")
    bad_yaml = tmp_path / "cluster.yaml"
    bad_yaml.write_text("nodes: [1, 2\n")
    missing = tmp_path / "partial.yaml"
    missing.write_text("nodes: 2\n")
    bad_plan = tmp_path / "plan.json"
    bad_plan.write_text(json.dumps({"schema": "uniap.plan/1", "model": {}}))
    for args in (["--model", str(bad_json), "--cluster", "a100-80g:1x8", "-b", "8"],
                 ["--model", "gpt2", "--cluster", str(bad_yaml), "-b", "8"],
                 ["--model", "gpt2", "--cluster", str(missing), "-b", "8"],
                 ["--plan", str(bad_plan)],
                 ["--plan", str(tmp_path / "absent.json")]):
        proc = cli("estimate", *args, check=False)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_yaml_cluster(cli_json, tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text("name: lab\nnodes: 2\ndevices_per_node: 4\nmemory_gb: 24\npeak_tflops: {bf16: 100, fp32: 20}\n"
                    "intra: {latency_us: 10, bandwidth_gbps: 50}\ninter: {latency_us: 30, bandwidth_gbps: 5}\n")
    plan = cli_json("estimate", "--model", "gpt2-medium", "--cluster", str(path), "-b", "16", "--dp", "8")
    assert plan["cluster"]["name"] == "lab" and plan["cluster"]["devices"] == 8
    assert plan["predicted"]["peak_memory_bytes"][0] <= 24e9


def test_listings(cli_json):
    names = {m["name"] for m in cli_json("models")["models"]}
    assert {"bert-large", "bert-huge", "t5-large", "vit-huge", "swin-huge", "gpt2", "gpt2-xl", "gpt3-175b",
            "llama2-70b", "llama3-405b", "tiny-gpt", "tiny-llama"} <= names
    presets = {c["preset"] for c in cli_json("clusters")["clusters"]}
    assert {"a100-40g", "a100-80g", "h100-80g", "v100-32g", "titanxp-12g", "cpu"} <= presets


def test_a_plan_that_records_no_engine_is_priced_with_the_kernel_it_runs_with(cli_json, tmp_path):
    """`uniap run` runs a plan without an engine entry with flash attention; `estimate --plan` prices that, not the
    cluster's default (standard attention on CPU, which keeps the score matrix)."""
    plan = cli_json("estimate", "--model", "gpt2", "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len", "1024",
                    "--dp", "4", "--precision", "fp32")
    assert plan["cluster"]["engine"]["attention"] == "standard"

    def recost(engine):
        cluster = {k: v for k, v in plan["cluster"].items() if k != "engine"}
        path = tmp_path / f"{engine or 'none'}.json"
        path.write_text(json.dumps({**plan, "cluster": cluster | ({"engine": engine} if engine else {})}))
        return cli_json("estimate", "--plan", str(path))["predicted"]

    none, flash = recost(None), recost({"kernels": "eager", "attention": "flash"})
    standard = recost({"kernels": "eager", "attention": "standard"})
    assert none == flash
    assert none["peak_memory_bytes"][0] < standard["peak_memory_bytes"][0]
