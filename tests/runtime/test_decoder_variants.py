"""The one decoder runs every Hugging Face decoder family's options: each family's config shrunk to a tiny
model (runtime_cases.tiny_family) keeps its options, builds with the spec's exact parameter count, trains
(finite loss and gradients), and refuses what it cannot run in one line. Gemma 3's options under tensor
parallelism equal one process: tests/runtime/test_runtime_equality.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime_cases import FAMILY_SEQ, FAMILY_WINDOW, tiny_family
from uniap.errors import UniapError
from uniap.models import build_model, lm_loss
from uniap.runtime.data import batch
from uniap.runtime.plans import decoder_parameters
from uniap.spec import build_layers

FAMILIES = ["llama3.1-8b", "mistral-7b-v0.1", "qwen2.5-7b", "qwen3-0.6b", "gemma-7b", "gemma-2-9b", "gemma-3-4b",
            "phi-3-mini-4k", "pythia-1.4b", "falcon-7b", "falcon-40b", "olmo-2-1124-7b", "starcoder2-7b",
            "c4ai-command-r-plus"]
SEQ, WINDOW = FAMILY_SEQ, FAMILY_WINDOW
tiny = tiny_family


@pytest.mark.parametrize("folder", FAMILIES)
def test_family_builds_with_the_spec_count_and_trains(folder):
    cfg = tiny(folder)
    model = build_model(cfg, seed=1)
    assert sum(p.numel() for p in model.parameters()) == build_layers(cfg, SEQ).parameters == decoder_parameters(cfg)
    x, y = batch(0, 2, SEQ, cfg.vocab)
    loss = lm_loss(model(x), y)
    loss.backward()
    assert 3.0 < loss.item() < 7.0  # ≈ ln(128) at init
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_sliding_window_restricts_attention():
    cfg = tiny("mistral-7b-v0.1")
    full = dataclasses.replace(cfg, sliding_window=0, sliding_layers=())
    x, _ = batch(0, 1, SEQ, cfg.vocab)
    windowed, dense = build_model(cfg, seed=2)(x), build_model(full, seed=2)(x)
    torch.testing.assert_close(windowed[:, :WINDOW], dense[:, :WINDOW])  # the window has not yet bound
    assert not torch.allclose(windowed[:, WINDOW:], dense[:, WINDOW:])


def test_partial_rotary_leaves_the_rest_of_the_head():
    from uniap.models.decoder import _rope

    x = torch.randn(1, 2, 8, 16)
    out = _rope(x, 0.25)
    torch.testing.assert_close(out[..., 4:], x[..., 4:])
    assert not torch.allclose(out[..., :4], x[..., :4])


@pytest.mark.parametrize("change, feature", [({"attn_softcap": 50.0}, "attention logit soft-capping"),
                                             ({"logit_softcap": 30.0}, "final logit soft-capping")])
def test_unsupported_features_are_refused_in_one_line(change, feature):
    with pytest.raises(UniapError, match=f"{feature} .* is not supported by `uniap run`"):
        build_model(dataclasses.replace(tiny("gemma-2-9b"), **change))


def test_tp_over_whole_head_norms_is_refused():
    from uniap.runtime.checks import check_plan
    from uniap.runtime.plans import uniform_plan

    plan = uniform_plan(tiny("olmo-2-1124-7b"), 2, tp=2, seq_len=SEQ)
    with pytest.raises(UniapError, match="q/k norms over several heads .* not supported by `uniap run`"):
        check_plan(plan, 2)
