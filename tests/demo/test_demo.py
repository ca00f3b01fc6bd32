"""profile -> calibrated plan -> run, end to end at a tiny size (two short torchrun launches, 2 ranks)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from uniap.errors import UniapError
from uniap.spec.model import ModelConfig

MICRO = ModelConfig(name="micro-gpt", family="gpt2", layers=2, hidden=64, heads=2, ffn=256, vocab=128, max_seq=16,
                    tied_embeddings=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from uniap.demo import run_demo

    out = tmp_path_factory.mktemp("demo")
    result = run_demo(out, nproc=2, steps=3, rounds=2, reps=1, passes=2, warmup=1, micro_batch_sizes=(1, 2),
                      rep_seconds=0.001, config=MICRO, seq_len=16, global_batch=4, comparisons=2, timeout_s=60)
    return out, result


def test_demo_reports_predicted_and_measured_for_every_plan(demo):
    out, result = demo
    rows = result["rows"]
    assert len(rows) == 3 and sum(r["chosen"] for r in rows) == 1
    for r in rows:
        assert r["predicted_s"] > 0 and r["measured_s"] > 0
        assert r["error"] == pytest.approx((r["predicted_s"] - r["measured_s"]) / r["measured_s"])
        assert r["predicted_memory_bytes"] > 0 and r["measured_memory_bytes"] > 0
    assert sorted(r["predicted_rank"] for r in rows) == [1, 2, 3]
    assert sorted(r["measured_rank"] for r in rows) == [1, 2, 3]
    assert -1.0 <= result["kendall_tau"] <= 1.0
    assert result["regret"] >= 0 and result["median_abs_rel_error"] >= 0
    assert result["round_spread"] >= 0  # two rounds of each plan: how far they disagree
    # the --format json contract
    assert {"rows", "median_abs_rel_error", "kendall_tau", "regret"} <= set(result)
    assert {"plan", "predicted_s", "measured_s"} <= set(rows[0])
    assert (out / "predicted_vs_measured.png").stat().st_size > 1000
    assert json.loads((out / "demo.json").read_text())["rows"][0]["plan"] == rows[0]["plan"]


def test_the_noise_under_a_demos_errors_is_how_far_one_plans_rounds_disagree():
    """`round_spread`: per plan, max/min − 1 of its rounds' median step times after the warm-up steps; the median
    over the plans. A neighbour on the host slows rounds unevenly and shows here, where the count of the machine's
    other processes cannot see it."""
    from uniap.demo import WARMUP_STEPS, round_spread, statistics

    warm = [9.0] * WARMUP_STEPS  # warm-up steps, left out however slow
    rows = [{"step_times_s": [warm + [1.0, 1.0, 1.2], warm + [1.1, 1.1, 1.1]]},  # rounds at 1.0 and 1.1: 10 %
            {"step_times_s": [warm + [2.0], warm + [3.0], warm + [2.5]]},  # 2.0 … 3.0: 50 %
            {"step_times_s": [warm + [4.0], warm + [4.0]]}]  # 0 %
    assert round_spread(rows) == pytest.approx(0.10)
    assert round_spread([{"step_times_s": [warm + [1.0]]}]) is None  # one round: nothing to compare
    scored = [{**row, "predicted_s": 1.0, "measured_s": 1.0, "error": 0.0, "memory_error": None} for row in rows]
    assert statistics(scored)["round_spread"] == pytest.approx(0.10)


def test_demo_profile_and_plan_are_consistent(demo):
    from uniap.plans import Plan
    from uniap.profile import calibrate, load_profile
    from uniap.demo import local_cluster, predict_plan
    from uniap.spec.families import build_layers
    from uniap.spec.workload import Workload

    out, result = demo
    doc = load_profile(out / "profile.json")
    assert doc["world_size"] == 2 and doc["model"]["name"] == "micro-gpt" and doc["device"]["backend"] == "gloo"
    assert doc["method"]["reps"] == 1 and doc["torch"]
    # one pass before planning, one between the two rounds of runs: the profile holds both
    assert doc["method"]["passes"] == 2 and result["planned_with"] == "the first profile pass"
    assert isinstance(result["whole_profile_chooses_the_same_plan"], bool)
    from uniap.profile.harness import CHAIN_REPS_PER_REP

    assert doc["chain"]["repetitions"] == CHAIN_REPS_PER_REP * 1 * 2  # reps 1, two passes, paired per repetition
    assert {rec["kind"] for rec in doc["layers"]} == {"embedding", "block", "head"}
    assert all(rec["fwd_bwd_s"] and min(rec["fwd_bwd_s"]) > 0 for rec in doc["layers"])
    assert all(rec["static_bytes"] > 0 for rec in doc["layers"])
    assert {(c["op"], c["n"]) for c in doc["collectives"]} == {("all_reduce", 2), ("all_gather", 2),
                                                               ("reduce_scatter", 2), ("p2p", 2)}
    assert doc["pipeline"] and doc["pipeline"][0]["stages"] == 2
    plan = Plan.load(out / "plan.json")
    assert plan.search and plan.search["candidates"] > 0
    model = build_layers(MICRO, 16)
    cluster = calibrate(local_cluster(2), doc, model=model, workload=Workload(4, 16, "fp32"))
    # the chosen plan's prediction is the cost model's calibrated with the whole profile, the same number
    # estimate --plan gives
    chosen = next(r for r in result["rows"] if r["chosen"])
    assert predict_plan(plan, model, cluster)["iteration_time_s"] == pytest.approx(chosen["predicted_s"])
    analytic = predict_plan(plan, model, local_cluster(2))["iteration_time_s"]
    assert analytic != pytest.approx(chosen["predicted_s"])
    # every plan run records the engine its prediction priced (the profile's attention kernel): a plan without
    # one runs flash, which keeps no score matrix, while the CPU profile measured the standard kernel
    for path in sorted((out / "plans").glob("*.json")):
        assert Plan.load(path).engine == local_cluster(2).engine, path.name


def test_profile_command_rejects_bad_input_before_spawning(tmp_path):
    from uniap.commands.profile import parse_sizes, profile_command

    with pytest.raises(UniapError, match="at least two different"):
        parse_sizes("4")
    with pytest.raises(UniapError, match="comma-separated integers"):
        parse_sizes("1,x")
    kw = dict(seq_len=None, nproc=2, out=str(tmp_path / "p.json"), micro_batch_sizes="1,2", reps=1, warmup=0,
              max_tp=None, timeout_s=10.0)
    from uniap.commands.profile import Fmt

    with pytest.raises(UniapError, match="unknown model"):
        profile_command(model="no-such-model", fmt=Fmt.json, **kw)
    with pytest.raises(UniapError, match="--nproc"):
        profile_command(model="tiny-gpt", fmt=Fmt.json, **{**kw, "nproc": 0})
    with pytest.raises(UniapError, match="--reps"):
        profile_command(model="tiny-gpt", fmt=Fmt.json, **{**kw, "reps": 0})
    assert not (tmp_path / "p.json").exists()


def test_demo_rejects_bad_input_before_spawning(tmp_path):
    from uniap.demo import run_demo

    with pytest.raises(UniapError, match="--steps"):
        run_demo(tmp_path, steps=2)
    with pytest.raises(UniapError, match="--rounds"):
        run_demo(tmp_path, rounds=0)
    with pytest.raises(UniapError, match="--passes"):
        run_demo(tmp_path, passes=0)
    with pytest.raises(UniapError, match="cannot read profile"):
        run_demo(tmp_path, profile_path=tmp_path / "missing.json")


def test_demo_runs_another_model_a_llama_with_grouped_query_attention(tmp_path):
    """`uniap demo --model M`: a llama-family config.json with GQA (2 kv heads for 4 query heads), end to end."""
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = subprocess.run([str(Path(sys.executable).with_name("uniap")), "demo", "--model", str(tmp_path / "config.json"),
                           "--seq-len", "16", "--global-batch", "4", "--nproc", "2", "--steps", "3", "--rounds", "1",
                           "--reps", "1", "--passes", "1", "--out-dir", str(tmp_path / "out"), "--format", "json"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["model"]["config"]["kv_heads"] == 2 and result["model"]["seq_len"] == 16
    assert len(result["rows"]) >= 5 and all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in result["rows"])


def test_demo_refuses_a_model_the_runtime_does_not_train(tmp_path):
    done = subprocess.run([str(Path(sys.executable).with_name("uniap")), "demo", "--model", "bert-large",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "bert" in done.stderr, done.stderr
