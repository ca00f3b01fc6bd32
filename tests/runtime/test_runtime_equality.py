"""Distributed training equals one-process training (3 steps; fp32 within 1e-5 relative, 16-bit within the
tolerances runtime/precision.py states) for every plan kind; measured memory against the cost model."""

from __future__ import annotations

import math

import pytest

from runtime_cases import TOL, equality_plans, memory_plans
from uniap.cost.memory import activation_bytes_per_sample, static_bytes
from uniap.runtime.precision import precision_of
from uniap.spec.families import build_layers


@pytest.mark.parametrize("name", list(equality_plans()))
def test_plan_matches_one_process(equality_results, name):
    res = equality_results[name]
    plan, _ = equality_plans()[name]
    assert res["steps"] == 3 and len(res["losses"]) == 3
    assert all(math.isfinite(l) for l in res["losses"])
    check = res["check"]
    assert check is not None
    precision = plan.workload.precision
    tol = precision_of(precision).check_tolerance
    assert res["precision"] == precision
    assert check["max_rel_loss_diff"] <= tol.loss, check
    assert check["max_rel_param_diff"] <= tol.params, check
    assert check["within_tolerance"]
    # measurements are present and shaped by the plan
    assert len(res["stage_time_s"]) == plan.pipeline.degree
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


def test_gpt2_config_with_tied_embeddings_plans_and_runs(equality_results):
    """GPT-2's config.json ties its embeddings: `uniap plan` plans it (in bf16) and the run equals one process in
    the same precision."""
    res = equality_results["gpt2-hf-planned"]
    check, tol = res["check"], precision_of(res["precision"]).check_tolerance
    assert res["precision"] == "bf16"
    assert check["max_rel_loss_diff"] <= tol.loss and check["max_rel_param_diff"] <= tol.params, check


def test_fp16_runs_with_a_loss_scale(equality_results):
    res = equality_results["fp16-tied-pp4"]
    assert res["loss_scale"] == {"final": 2.0 ** 16, "skipped_steps": 0}
    assert equality_results["bf16-gpt-pp2-mixed"]["loss_scale"] is None


def _predicted_bytes(plan, parts) -> float:
    """The cost model's bytes per rank (`parts`: static and/or activations) of a one-stage plan, one micro-batch."""
    model = build_layers(plan.model_config(), int(plan.model.seq_len))
    precision, samples = plan.workload.precision, plan.workload.global_batch
    total = 0.0
    for spec, layer in zip(model.layers, plan.layers):
        s = layer.strategy
        if "static" in parts:
            total += static_bytes(spec, s, precision)
        if "activations" in parts:
            total += samples // s.dp * activation_bytes_per_sample(spec, s, precision, flash_attention=True)
    return total


@pytest.mark.parametrize("model", ["llama", "gpt"])
def test_sequence_parallel_saves_the_activation_memory_the_cost_model_predicts(equality_results, model):
    """Same parameters, same static bytes: the peak difference is the blocks' activation saving (per layer:
    tests/runtime/test_sp_memory.py)."""
    plans = memory_plans()
    saved = max(equality_results[f"mem-{model}-tp4"]["peak_memory_bytes"]) - \
        max(equality_results[f"mem-{model}-tp4sp"]["peak_memory_bytes"])
    predicted = _predicted_bytes(plans[f"mem-{model}-tp4"], ["activations"]) - \
        _predicted_bytes(plans[f"mem-{model}-tp4sp"], ["activations"])
    assert predicted > 0
    assert saved == pytest.approx(predicted, rel=0.05)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_memory_per_rank_matches_the_cost_models_per_precision_bytes(equality_results, precision):
    """AdamW: 16 B/param either way (fp32 master, gradient and two moments; the cost model's 2 + 2 + 12 for
    mixed precision), activations at 2 or 4 B per value."""
    name = f"mem-llama-dp4-{precision}"
    measured = equality_results[name]["peak_memory_bytes"]
    predicted = _predicted_bytes(memory_plans()[name], ["static", "activations"])
    assert all(m == pytest.approx(predicted, rel=0.05) for m in measured), (measured, predicted)
    assert equality_results[name]["precision"] == precision


@pytest.mark.parametrize("name", ["gemma3-tp2", "gemma3-tp2sp"])
def test_decoder_family_options_match_one_process(two_rank_results, name):
    check = two_rank_results[name]["check"]
    assert check["max_rel_loss_diff"] <= TOL and check["max_rel_param_diff"] <= TOL, check
