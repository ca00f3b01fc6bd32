"""Pieces that need no process group: models, plans, data, checkpoint bookkeeping, imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from runtime_cases import GPT, LLAMA, TIED
from uniap.models import DecoderSlice, build_model, layer_names, lm_loss
from uniap.plans import Plan
from uniap.runtime import checkpoint as ckpt
from uniap.runtime.data import batch
from uniap.runtime.plans import decoder_parameters, uniform_plan
from uniap.strategies import Strategy


def test_slices_share_names_and_init_with_the_full_model():
    for cfg in (GPT, LLAMA):
        full = dict(build_model(cfg, seed=3).named_parameters())
        assert sum(p.numel() for p in full.values()) == decoder_parameters(cfg)
        for first, last in ((0, 1), (2, 4), (5, 5)):
            part = dict(DecoderSlice(cfg, first, last, seed=3).named_parameters())
            assert part and set(part) <= set(full)
            for name, p in part.items():
                assert torch.equal(p, full[name]), name


def test_tied_head_shares_the_embedding_in_one_process_and_copies_it_in_a_slice():
    full = build_model(TIED, seed=2)
    assert full.head.lm.weight is full.embed.tok.weight
    assert "head.lm.weight" not in dict(full.named_parameters())  # one parameter, trained once
    head_only = DecoderSlice(TIED, TIED.layers + 1, TIED.layers + 1, seed=2)
    assert torch.equal(head_only.head.lm.weight, full.embed.tok.weight)
    assert head_only.head.lm.weight is not full.embed.tok.weight
    assert sum(p.numel() for p in full.parameters()) == decoder_parameters(TIED)


def test_loss_scaler_unscales_exactly_skips_on_overflow_and_grows():
    from uniap.runtime.precision import LossScaler

    w = torch.nn.Parameter(torch.zeros(3))
    scaler = LossScaler(growth_interval=2)
    w.grad = torch.tensor([1.0, -2.0, 3.0]) * scaler.scale
    assert scaler.unscale_or_skip([w]) and torch.equal(w.grad, torch.tensor([1.0, -2.0, 3.0]))
    w.grad = torch.tensor([1.0, float("inf"), 0.0])
    assert not scaler.unscale_or_skip([w])
    assert w.grad is None and scaler.scale == 2.0 ** 15 and scaler.skipped_steps == 1
    for _ in range(2):
        w.grad = torch.ones(3)
        assert scaler.unscale_or_skip([w])
    assert scaler.scale == 2.0 ** 16  # two clean steps after the overflow: doubled back
    opt = torch.optim.SGD([w], lr=1.0, momentum=0.9)
    w.grad = None  # a skipped step leaves the parameter and the momentum untouched
    opt.step()
    assert torch.equal(w.detach(), torch.zeros(3)) and not opt.state[w]


def test_model_runs_and_chain_names():
    assert layer_names(GPT) == ["embed", "block.0", "block.1", "block.2", "block.3", "head"]
    x, y = batch(0, 2, 16, LLAMA.vocab)
    loss = lm_loss(build_model(LLAMA)(x), y)
    assert 5.0 < loss.item() < 7.5  # ≈ ln(512) at init


@pytest.mark.parametrize("attention", ["flash", "standard"])
def test_every_recompute_level_gives_the_same_gradients(attention):
    from uniap.models.decoder import use_attention_kernel
    from uniap.runtime.parallelize import apply_strategy

    x, y = batch(0, 2, 16, LLAMA.vocab)
    grads = []
    for level in ("none", "selective", "full"):
        model = build_model(LLAMA)
        use_attention_kernel(model, attention)
        for _, layer in model.chain():
            apply_strategy(layer, Strategy(1, 1, recompute=level), None)
        lm_loss(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for other in grads[1:]:
        for name in grads[0]:
            torch.testing.assert_close(grads[0][name], other[name], rtol=0, atol=1e-6)


def test_data_is_a_function_of_step():
    a, b = batch(4, 8, 32, 512, seed=1), batch(4, 8, 32, 512, seed=1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], batch(5, 8, 32, 512, seed=1)[0])
    assert torch.equal(a[0][:, 1:], a[1][:, :-1])


def test_text_data(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello world, " * 20)
    x, y = batch(0, 4, 16, 512, data=str(path))
    assert x.shape == (4, 16) and int(x.max()) < 512


def test_uniform_plan_round_trips_and_overrides():
    plan = uniform_plan(GPT, 4, pp=2, tp=2, micro_batches=2, stage_layers=[2, 4],
                        per_layer={"block.3": Strategy(2, 1, 3), 0: {"dp": 2, "tp": 1, "zero": 3}})
    again = Plan.from_json(plan.to_json())
    assert again.stages[0].layers == (0, 1) and again.stages[1].ranks == (2, 3)
    assert again.layers[4].strategy == Strategy(2, 1, 3)
    assert again.layers[0].strategy == Strategy(2, 1, 3)
    assert again.layers[1].strategy == Strategy(1, 2)
    assert again.fingerprint == plan.fingerprint


def test_latest_checkpoint_ignores_incomplete(tmp_path):
    assert ckpt.latest(tmp_path) is None
    (tmp_path / "step-00000002").mkdir()
    (tmp_path / "step-00000002" / "meta.json").write_text("{}")
    (tmp_path / ".tmp-step-00000004").mkdir()  # a save that died before its rename
    (tmp_path / "step-00000006").mkdir()  # no meta.json: not written by us / incomplete
    assert ckpt.latest(tmp_path) == (2, tmp_path / "step-00000002")


def test_runtime_never_imports_the_solver():
    code = ("import sys, uniap.runtime.launch, uniap.runtime.train, uniap.runtime.worker; "
            "print(any(m.startswith('uniap.solve') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    light = subprocess.run([sys.executable, "-c", "import sys, uniap.runtime; print('torch' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "False"
