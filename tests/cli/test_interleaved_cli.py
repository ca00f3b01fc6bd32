"""Interleaved 1F1B as a user meets it: estimate, the plan contract, re-costing and the search."""

import json

import pytest

EST = ["estimate", "--model", "gpt2", "--cluster", "a100-80g:1x8", "--global-batch", "16", "--pp", "2", "--dp", "4",
       "--micro-batch-size", "1"]


def test_interleaved_estimate_contract_and_recost(cli, cli_json, tmp_path):
    plain = cli_json(*EST)
    inter = cli_json(*EST, "--schedule", "interleaved-1f1b", "--virtual-stages", "2")
    assert inter["pipeline"] == {"degree": 2, "micro_batches": 4, "schedule": "interleaved-1f1b", "virtual_stages": 2}
    # 12 blocks over 4 chunks: chunk j on stage j mod 2; embedding with chunk 0, head with chunk 3
    assert [s["chunks"] for s in inter["stages"]] == [[[0, 3], [7, 9]], [[4, 6], [10, 13]]]
    assert [l["chunk"] % 2 == l["stage"] for l in inter["layers"]] == [True] * 14
    # a smaller bubble than 1F1B, and a prediction no lower than the schedule's event simulation
    assert inter["predicted"]["iteration_time_s"] < plain["predicted"]["iteration_time_s"]
    assert inter["predicted"]["bubble_fraction"] < plain["predicted"]["bubble_fraction"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(inter))
    from uniap.plans import Plan
    from uniap.report.render import recost, timeline_boxes
    from uniap.report.timeline import makespan

    figures = recost(Plan.load(path))
    assert figures.tpi == pytest.approx(inter["predicted"]["iteration_time_s"], rel=1e-9)
    assert makespan(timeline_boxes(Plan.load(path), figures)) <= figures.tpi
    again = cli_json("estimate", "--plan", str(path))
    assert again["predicted"]["iteration_time_s"] == pytest.approx(inter["predicted"]["iteration_time_s"], rel=1e-12)
    proc = cli("run", "--plan", str(path), "--nproc", "4", check=False)
    assert proc.returncode == 2 and "plan is for 8 ranks" in proc.stderr and "Traceback" not in proc.stderr


def test_interleaved_bad_input_is_one_line(cli):
    for extra, words in ((["--schedule", "interleaved-1f1b"], "needs at least 2 virtual stages"),
                         (["--schedule", "interleaved-1f1b", "--virtual-stages", "2", "--pp", "1"], "at least 2"),
                         (["--virtual-stages", "3"], "runs one chunk per stage, got 3 virtual stages")):
        args = list(EST)
        if "--pp" in extra:
            args[args.index("--pp") + 1], args[args.index("--dp") + 1] = "1", "8"
            extra = extra[:4]
        proc = cli(*args, *extra, check=False)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_interleaving_refusals_are_one_line(cli):
    proc = cli("compare", "--model", "gpt2", "--cluster", "a100-80g:1x8", "--global-batch", "16", "--schedule",
               "interleaved-1f1b", check=False)
    assert proc.returncode == 2 and "uniap plan --schedule interleaved-1f1b" in proc.stderr
    from uniap.errors import UniapError
    from uniap.runtime.plans import uniform_plan
    from uniap.spec import zoo_config

    with pytest.raises(UniapError, match="at least 2 stages"):
        uniform_plan(zoo_config("tiny-gpt"), 4, pp=1, dp=4, micro_batches=2, schedule="interleaved-1f1b",
                     virtual_stages=2)


def test_plan_searches_interleaving_unless_the_schedule_restricts_it(cli_json):
    plain = cli_json("plan", "--model", "gpt3-1.3b", "--cluster", "a100-40g:2x8", "--global-batch", "64",
                     "--seq-len", "2048", "--max-tp", "1", "--schedule", "1f1b")
    both = cli_json("plan", "--model", "gpt3-1.3b", "--cluster", "a100-40g:2x8", "--global-batch", "64",
                    "--seq-len", "2048", "--max-tp", "1", "--max-virtual-stages", "3")
    assert plain["pipeline"]["virtual_stages"] == 1 and both["search"]["optimal"]
    assert both["search"]["candidates"] > plain["search"]["candidates"]
    # the larger space can only do as well or better
    assert both["predicted"]["iteration_time_s"] <= plain["predicted"]["iteration_time_s"] * (1 + 1e-9)


def test_one_virtual_stage_searches_1f1b_alone(cli_json):
    """With one chunk per stage the interleaved search is 1F1B's; the default one adds zero bubble's ZB-H1 (v = 1)
    candidates, one per pipeline of c a multiple of P."""
    args = ("--model", "gpt3-1.3b", "--cluster", "a100-40g:2x8", "--global-batch", "64", "--seq-len", "2048",
            "--max-tp", "1")
    plan = cli_json("plan", *args, "--max-virtual-stages", "1", "--schedule", "interleaved-1f1b")
    restricted = cli_json("plan", *args, "--schedule", "1f1b")
    every = cli_json("plan", *args, "--max-virtual-stages", "1")
    assert plan["pipeline"]["virtual_stages"] == 1
    assert plan["search"]["candidates"] == restricted["search"]["candidates"]
    # P ∈ {2, 4, 8, 16} with c ∈ divisors of 64 that P divides: 6 + 5 + 4 + 3
    assert every["search"]["candidates"] == restricted["search"]["candidates"] + 18
    assert every["predicted"]["iteration_time_s"] <= restricted["predicted"]["iteration_time_s"] * (1 + 1e-9)
