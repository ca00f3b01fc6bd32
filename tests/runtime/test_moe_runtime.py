"""Mixture-of-experts blocks in the runtime: the decoder's routing against a per-token loop, what `uniap run`
refuses, and expert-parallel runs on 4 gloo ranks equal to one process (fp32 tolerance of runtime/precision.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from runtime_cases import LR
from uniap.errors import UniapError
from uniap.models.decoder import build_model, lm_loss, take_aux_losses
from uniap.runtime.checks import check_plan
from uniap.runtime.plans import decoder_parameters, uniform_plan
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy as S

MOE = ModelConfig(name="tiny-moe", family="llama", layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=128,
                  max_seq=32, gated_mlp=True, norm="rmsnorm", bias=False, learned_positions=False,
                  tied_embeddings=False, experts=4, experts_per_token=2, expert_ffn=32)
SHARED = dataclasses.replace(MOE, name="tiny-moe-shared", shared_ffn=64, shared_gate=True)
# block 0 dense, blocks 1-2 MoE with a shared expert, a router bias and expert biases
MIXED = dataclasses.replace(MOE, name="tiny-moe-mixed", layers=3, moe_layers=(1, 2), shared_ffn=48,
                            router_bias=True, expert_bias=True)
SEQ = 16


def _moe_plan(config: ModelConfig, ep: int, pp: int = 1, **options):
    """Every layer data-parallel over its stage, the MoE blocks with expert-parallel degree `ep` (`recompute`:
    the last block recomputed); the other `options` go to uniform_plan."""
    recompute = options.pop("recompute", False)
    blocks = {f"block.{i}": {"ep": ep, "recompute": recompute and i == config.layers - 1} for i in config.moe_layers}
    return uniform_plan(config, 4, pp=pp, dp=4 // pp, seq_len=SEQ, per_layer=blocks, **options)


def test_routing_and_load_balancing_loss_follow_the_docstring():
    """The block's output is Σ of the renormalised top-k weights times its experts, plus the gated shared expert;
    the load-balancing loss is α · E · Σ_e f_e · P_e per sequence, averaged over the batch."""
    config = dataclasses.replace(SHARED, layers=1)
    torch.manual_seed(0)
    moe = build_model(config, seed=3).blocks["0"].mlp
    x = torch.randn(3, 5, config.hidden)
    y = moe(x)
    tokens = x.reshape(-1, config.hidden)
    ex = moe.experts
    probs = F.softmax(moe.router(tokens), dim=-1)
    expected = []
    for t, p in zip(tokens, probs):
        w, chosen = p.topk(config.experts_per_token)
        out = sum(wi / w.sum() * (F.silu(ex.gate[e] @ t) * (ex.up[e] @ t)) @ ex.down[e].T for wi, e in zip(w, chosen))
        shared = moe.shared.down(F.silu(moe.shared.gate(t)) * moe.shared.up(t))
        expected.append(out + torch.sigmoid(moe.shared_gate(t)) * shared)
    torch.testing.assert_close(y.reshape(-1, config.hidden), torch.stack(expected), rtol=1e-5, atol=1e-6)
    y.sum().backward()
    p = probs.view(3, 5, -1)
    f = F.one_hot(p.topk(2, dim=-1).indices, config.experts).sum(2).float().mean(1)
    aux = moe.aux_loss_coef * (config.experts * (f * p.mean(1)).sum(-1)).mean().detach()
    assert take_aux_losses(moe) == pytest.approx(aux.item(), rel=1e-6)
    assert take_aux_losses(moe) == 0.0  # taken once


def test_balanced_routing_costs_k_times_the_coefficient():
    """A router that gives every expert the same probability: f_e = k/E, P_e = 1/E, aux = E · E · k/E² = k."""
    model = build_model(dataclasses.replace(MOE, layers=1), seed=0)
    moe = model.blocks["0"].mlp
    with torch.no_grad():
        moe.router.weight.zero_()
    lm_loss(model(torch.randint(0, MOE.vocab, (2, SEQ))), torch.randint(0, MOE.vocab, (2, SEQ))).backward()
    assert take_aux_losses(model) == pytest.approx(moe.aux_loss_coef * MOE.experts_per_token)


@pytest.mark.parametrize("config", [MOE, SHARED, MIXED])
def test_decoder_parameters_match_the_spec(config):
    assert sum(p.numel() for p in build_model(config).parameters()) == decoder_parameters(config)


@pytest.mark.parametrize("change, message", [
    ({"config": dataclasses.replace(MOE, kv_lora_rank=16)}, "multi-head latent attention"),
    ({"config": dataclasses.replace(MOE, attn_sinks=True)}, "attention sinks"),
    ({"precision": "bf16"}, "fp32 only"),
    ({"per_layer": {"block.0": S(4, 1, ep=2, etp=2)}}, "expert tensor parallelism"),
    ({"per_layer": {"block.0": S(2, 2, ep=2)}}, "tp 2 on an MoE block"),
    ({"per_layer": {"head": S(4, 1, ep=2)}}, "on a layer without experts"),
    ({"config": dataclasses.replace(MOE, experts=6), "per_layer": {"block.0": S(4, 1, ep=4)}},
     "ep 4 does not divide the 6 experts"),
])
def test_what_the_runtime_cannot_run_is_refused_in_one_line(change, message):
    config = change.pop("config", MOE)
    if config.kv_lora_rank or config.attn_sinks:  # the decoder refuses them before any plan exists
        with pytest.raises(UniapError, match=message):
            build_model(config)
        return
    plan = uniform_plan(config, 4, dp=4, seq_len=SEQ, **change)
    with pytest.raises(UniapError, match=message) as err:
        check_plan(plan, 4)
    assert "\n" not in str(err.value)


def moe_plans():
    """name -> (plan, job options) of the 4-rank MoE launch."""
    return {
        "ep2-dp4-mb2": (_moe_plan(MOE, 2, micro_batches=2), {}),
        "ep4-shared": (_moe_plan(SHARED, 4), {}),
        "pp2-ep2-shared-recompute": (_moe_plan(SHARED, 2, pp=2, micro_batches=2, recompute=True), {}),
        # a dense block beside MoE blocks; ep2 with biases; another load-balancing weight
        "mixed-ep2-bias": (_moe_plan(MIXED, 2, micro_batches=2), {"aux_loss_coef": 0.1}),
        "mixed-ep1": (_moe_plan(MIXED, 1, pp=2, micro_batches=2), {}),
        # ZeRO shards the blocks' other parameters over dp; the experts stay all-reduced over edp
        "ep2-zero3": (_moe_plan(SHARED, 2, zero=3, micro_batches=2), {}),
        "ep2-zero1-edp1": (_moe_plan(MOE, 2, pp=2, zero=1), {}),
    }


@pytest.fixture(scope="module")
def moe_results(tmp_path_factory):
    from uniap.runtime.job import TrainingJob as Job
    from uniap.runtime.launch import run_many

    root = tmp_path_factory.mktemp("moe")
    names, jobs = [], []
    for name, (plan, extra) in moe_plans().items():
        plan.save(root / f"{name}.json")
        names.append(name)
        jobs.append(Job(str(root / f"{name}.json"), steps=3, check=True, lr=LR, **extra))
    # expert-parallel checkpoints load under another ep: saved under ep4, resumed under pp2 · ep2
    names += ["save-ep4", "resume-pp2-ep2"]
    jobs += [Job(str(root / "ep4-shared.json"), steps=3, lr=LR, checkpoint_dir=str(root / "ckpt"), checkpoint_every=3),
             Job(str(root / "pp2-ep2-shared-recompute.json"), steps=5, lr=LR, check=True, resume=True,
                 checkpoint_dir=str(root / "ckpt"))]
    return dict(zip(names, run_many(jobs, nproc=4, timeout_s=90)))


@pytest.mark.parametrize("name", list(moe_plans()))
def test_expert_parallel_run_matches_one_process(moe_results, name):
    res = moe_results[name]
    check = res["check"]
    assert res["steps"] == 3
    assert check["max_rel_loss_diff"] <= check["tolerance"]["loss"], check
    assert check["max_rel_param_diff"] <= check["tolerance"]["params"], check
    assert check["tolerance"]["params"] == pytest.approx(1e-5)


def test_a_larger_load_balancing_weight_changes_the_losses(moe_results):
    """The reported losses carry the load-balancing term: MIXED under α = 0.1 against α = 0.01."""
    a, b = moe_results["mixed-ep2-bias"]["losses"][0], moe_results["mixed-ep1"]["losses"][0]
    assert a - b == pytest.approx(0.09 * 2 * MIXED.experts_per_token, rel=0.2)


def test_expert_parallel_checkpoint_resumes_under_another_ep(moe_results):
    resumed = moe_results["resume-pp2-ep2"]
    assert resumed["first_step"] == 3 and resumed["steps"] == 2
    assert resumed["check"]["within_tolerance"], resumed["check"]
