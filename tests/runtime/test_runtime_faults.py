"""Refusals (one-line UniapError, nothing spawned) and a failing rank ending the run quickly."""

from __future__ import annotations

import json
import time

import pytest

from runtime_cases import GPT, LLAMA
from uniap.errors import UniapError
from uniap.runtime.checks import check_plan
from uniap.runtime.launch import run
from uniap.runtime.plans import uniform_plan
from uniap.strategies import Strategy


def _save(plan, tmp_path, name="plan.json"):
    path = tmp_path / name
    plan.save(path)
    return str(path)


def test_plan_for_another_world_size_refused(tmp_path, monkeypatch):
    plan = uniform_plan(GPT, 2, dp=2)
    with pytest.raises(UniapError, match="plan is for 2 ranks but the world has 4"):
        check_plan(plan, 4)
    path = _save(plan, tmp_path)
    with pytest.raises(UniapError, match="plan is for 2 ranks but nproc=4"):
        run(path, nproc=4)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UniapError, match="torchrun world has 4"):
        run(path)


def test_edited_plan_for_another_model_refused(tmp_path):
    path = tmp_path / "plan.json"
    data = uniform_plan(GPT, 4).to_json()
    data["model"]["config"]["hidden"] = 256  # another model under the old fingerprint
    path.write_text(json.dumps(data))
    with pytest.raises(UniapError, match="fingerprint"):
        run(str(path), nproc=4)


def test_resume_from_another_models_checkpoint_refused(tmp_path):
    ck = tmp_path / "ck" / "step-00000003"
    ck.mkdir(parents=True)
    (ck / "meta.json").write_text(json.dumps({"model": "tiny-llama", "arch": "0123456789abcdef", "step": 3}))
    path = _save(uniform_plan(GPT, 4), tmp_path)
    with pytest.raises(UniapError, match="cannot be resumed"):
        run(path, nproc=4, resume=True, checkpoint_dir=str(tmp_path / "ck"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(global_batch=6, micro_batches=4), "does not split into 4 micro-batches"),
    (dict(global_batch=8, micro_batches=4, dp=4), r"does not split 4 ways \(dp\)"),
    (dict(tp=4, sp=True, seq_len=30), "sequence parallelism needs tp 4 to divide seq_len 30"),
    (dict(precision="fp8"), "precision fp8 is not supported by `uniap run`"),
    (dict(precision="fp4"), "unknown precision 'fp4'"),
])
def test_batch_errors(kwargs, message):
    with pytest.raises(UniapError, match=message):
        check_plan(uniform_plan(GPT, 4, **kwargs), 4)


def test_tp_must_divide_heads_ffn_vocab():
    with pytest.raises(UniapError, match="tp 3 does not divide heads 4"):
        check_plan(uniform_plan(GPT, 3, tp=3, global_batch=6,
                                per_layer={"embed": Strategy(3, 1), "head": Strategy(3, 1)}), 3)
    odd_vocab = GPT.__class__(**{**GPT.__dict__, "vocab": 510, "name": "odd"})
    with pytest.raises(UniapError, match="tp 4 does not divide vocab 510"):
        check_plan(uniform_plan(odd_vocab, 4, tp=4), 4)
    odd_ffn = LLAMA.__class__(**{**LLAMA.__dict__, "ffn": 350, "name": "odd"})
    with pytest.raises(UniapError, match="tp 4 does not divide ffn 350"):
        check_plan(uniform_plan(odd_ffn, 4, tp=4, per_layer={"embed": Strategy(4, 1), "head": Strategy(4, 1)}), 4)


def test_unsupported_model_refused():
    encoder = GPT.__class__(**{**GPT.__dict__, "family": "bert"})
    with pytest.raises(UniapError, match="decoder families"):
        uniform_plan(encoder, 4)


def test_failing_rank_ends_the_run_quickly(tmp_path, monkeypatch):
    path = _save(uniform_plan(GPT, 4, pp=2, tp=2, micro_batches=2), tmp_path)
    monkeypatch.setenv("UNIAP_FAIL_RANK", "1")
    monkeypatch.setenv("UNIAP_FAIL_STEP", "1")
    t0 = time.monotonic()
    with pytest.raises(UniapError) as err:
        run(path, steps=3, nproc=4, timeout_s=30)
    elapsed = time.monotonic() - t0
    assert "rank 1 failed" in str(err.value) and "injected failure" in str(err.value)
    assert "\n" not in str(err.value)
    assert elapsed < 60, elapsed


def test_zero_bubble_refuses_sharded_layers_and_partial_rounds():
    """torch's weight pass assigns gradients outside autograd, where FSDP2's reduce-scatter hooks would run."""
    with pytest.raises(UniapError, match="zero-bubble schedule runs ZeRO-0 layers only .*ZeRO-3"):
        check_plan(uniform_plan(GPT, 4, pp=2, dp=2, zero=3, micro_batches=2, schedule="zero-bubble"), 4)
    with pytest.raises(UniapError, match=r"micro-batch count \(3\) to be a multiple of the pipeline degree \(2\)"):
        check_plan(uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=3, global_batch=12, schedule="zero-bubble"), 4)
    assert check_plan(uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=2, schedule="zero-bubble"), 4).schedule \
        == "zero-bubble"
