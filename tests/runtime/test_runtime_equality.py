"""Distributed training equals one-process training (fp32, 3 steps, 1e-5 relative) for every plan kind."""

from __future__ import annotations

import math

import pytest

from runtime_cases import TOL, equality_plans


@pytest.mark.parametrize("name", list(equality_plans()))
def test_plan_matches_one_process(equality_results, name):
    res = equality_results[name]
    plan, _ = equality_plans()[name]
    assert res["steps"] == 3 and len(res["losses"]) == 3
    assert all(math.isfinite(l) for l in res["losses"])
    check = res["check"]
    assert check is not None
    assert check["max_rel_loss_diff"] <= TOL, check
    assert check["max_rel_param_diff"] <= TOL, check
    # measurements are present and shaped by the plan
    assert len(res["stage_time_s"]) == plan.pipeline["degree"]
    assert all(t is not None and t > 0 for t in res["stage_time_s"])
    assert res["iteration_time_s"] > 0
    assert len(res["peak_memory_bytes"]) == 4 and all(m > 0 for m in res["peak_memory_bytes"])


def test_zero3_shards_memory(equality_results):
    """ZeRO-3 over 4 ranks keeps less state per rank than replication."""
    dp = equality_results["gpt-dp4"]["peak_memory_bytes"]
    z3 = equality_results["gpt-dp4-zero3-mb2"]["peak_memory_bytes"]
    assert max(z3) < min(dp)


def test_resume_under_other_plan_and_world_equals_uninterrupted(equality_results, two_rank_results):
    saved = equality_results["save"]
    whole = equality_results["uninterrupted"]
    resumed = two_rank_results["resume"]
    assert saved["losses"] == pytest.approx(whole["losses"][:3], rel=TOL)
    assert resumed["first_step"] == 3 and resumed["resumed_from"] == 3 and resumed["steps"] == 2
    # continued losses equal the uninterrupted 4-rank run and the uninterrupted one-process run
    assert resumed["losses"] == pytest.approx(whole["losses"][3:], rel=TOL)
    assert resumed["check"]["max_rel_loss_diff"] <= TOL
    assert resumed["check"]["max_rel_param_diff"] <= TOL


@pytest.mark.parametrize("name", ["resume-plain-from-v2", "resume-v2-from-plain"])
def test_checkpoints_cross_between_plain_and_interleaved_plans(equality_results, name):
    whole = equality_results["uninterrupted"]
    resumed = equality_results[name]
    assert equality_results["save-v2"]["losses"] == pytest.approx(whole["losses"][:3], rel=TOL)
    assert resumed["first_step"] == 3 and resumed["steps"] == 2
    assert resumed["losses"] == pytest.approx(whole["losses"][3:], rel=TOL)
    assert resumed["check"]["max_rel_loss_diff"] <= TOL and resumed["check"]["max_rel_param_diff"] <= TOL


def test_grouped_query_attention_tp(two_rank_results):
    check = two_rank_results["gqa"]["check"]
    assert check["max_rel_loss_diff"] <= TOL and check["max_rel_param_diff"] <= TOL


def test_decoder_family_options_match_one_process(two_rank_results):
    check = two_rank_results["gemma3-tp2"]["check"]
    assert check["max_rel_loss_diff"] <= TOL and check["max_rel_param_diff"] <= TOL
