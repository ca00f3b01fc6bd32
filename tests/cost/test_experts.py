"""Routed experts in the cost model: expert-parallel strategies, their memory, compute and token exchange, and the
MILP over expert columns against the enumeration oracle."""

import dataclasses

import numpy as np
import pytest

from reference_check import assert_milp_equals_reference
from uniap.cost import comm
from uniap.cost.compute import grouped_gemm_times
from uniap.cost.memory import STATE_BYTES, activation_bytes_per_sample, static_bytes
from uniap.cost.tables import build_program, disallowed, layer_cost, stage_links
from uniap.errors import UniapError
from uniap.spec.cluster import load_cluster
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.spec.ops import GroupedGemm
from uniap.spec.workload import Workload
from uniap.strategies import Strategy, enumerate_strategies, expert_layouts_of


def moe_config(**over) -> ModelConfig:
    base = dict(name="tiny-moe", family="mistral", layers=3, hidden=1024, heads=16, kv_heads=4, ffn=2816,
                vocab=32000, gated_mlp=True, norm="rmsnorm", bias=False, learned_positions=False, max_seq=4096,
                experts=8, experts_per_token=2, moe_layers=(1, 2))
    return ModelConfig(**{**base, **over})


@pytest.fixture(scope="module")
def model():
    return build_layers(moe_config(), 2048)


def test_strategy_carries_ep_through_json_and_label():
    s = Strategy(dp=8, tp=2, zero=1, sp=True, ep=4, etp=2)
    assert s.label() == "dp8·tp2sp·z1·ep4·etp2"
    assert s.edp == 2 and s.moe
    assert Strategy.from_json(s.to_json()) == s
    assert Strategy.from_json({"dp": 4, "tp": 1}) == Strategy(4, 1)  # plans written before ep
    with pytest.raises(UniapError, match="does not divide"):
        Strategy(dp=3, tp=1, ep=2)


def test_expert_layouts_divide_devices_and_experts():
    assert expert_layouts_of(8, 8) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    assert expert_layouts_of(8, 6) == [(1, 1), (2, 1)]
    assert (2, 2) in expert_layouts_of(8, 8, max_etp=2)
    plain = enumerate_strategies(8)
    moe = enumerate_strategies(8, experts=8)
    assert len(moe) == 4 * len(plain) and set(plain) <= set(moe)


def test_ep_applies_to_moe_layers_only(model):
    dense, moe = model.layers[1], model.layers[2]
    assert dense.experts == 0 and moe.experts == 8 and moe.expert_ffn == 2816
    assert "no routed experts" in disallowed(dense, Strategy(4, 1, ep=2), 4)
    assert disallowed(moe, Strategy(4, 1, ep=2), 4) is None
    assert "does not divide the 8 experts" in disallowed(moe, Strategy(16, 1, ep=16), 16)
    assert disallowed(moe, Strategy(8, 1, etp=8), 8) is None  # 2816 = 8 · 352
    odd = build_layers(moe_config(ffn=2817), 2048).layers[2]
    assert "etp 2 does not divide the expert inner size 2817" in disallowed(odd, Strategy(4, 1, etp=2), 4)


def test_expert_states_shard_by_ep_and_zero_over_edp(model):
    layer = model.layers[2]
    w, g, o = STATE_BYTES["bf16"]
    dense = layer.params - layer.expert_params  # the attention, router and norms: tp 1 here
    s = Strategy(dp=8, tp=1, zero=1, ep=4)
    expected = dense * (w + g + o / 8) + layer.expert_params / 4 * (w + g + o / 2)  # edp = 8 / 4
    assert static_bytes(layer, s, "bf16") == pytest.approx(expected)
    s3 = Strategy(dp=8, tp=1, zero=3, ep=8)
    assert static_bytes(layer, s3, "bf16") == pytest.approx((dense / 8 + layer.expert_params / 8) * (w + g + o))


def test_routed_activations_spread_over_the_stage(model):
    layer = model.layers[2]
    base = activation_bytes_per_sample(layer, Strategy(4, 1), "bf16", True)
    routed = layer.act_routed + layer.act_routed_etp
    assert base == pytest.approx(layer.act_tp + layer.act_other + routed)
    # ep does not change what a device keeps per sample (tokens are spread either way); etp keeps token copies
    assert activation_bytes_per_sample(layer, Strategy(4, 1, ep=4), "bf16", True) == pytest.approx(base)
    etp2 = activation_bytes_per_sample(layer, Strategy(4, 1, etp=2), "bf16", True)
    assert etp2 - base == pytest.approx(layer.act_routed)
    assert activation_bytes_per_sample(layer, Strategy(4, 1), "bf16", True, imbalance=1.5) - base == \
        pytest.approx(0.5 * routed)


def test_grouped_gemm_does_the_routed_flops_of_the_stage(model):
    """On a device with no quantisation or gaps, the d devices' grouped-GEMM time adds up to the layer's routed
    FLOPs (forward and backward) at the device's rate, whatever ep and etp; the imbalance scales it."""
    device = dataclasses.replace(load_cluster("h100-80g:1x8").device, sm_count=0, gemm_half_k=0.0, kernel_gap_s=0.0)
    peak = 1e15
    layer = model.layers[2]
    ops = [op for op in layer.ops if isinstance(op, GroupedGemm)]
    s, k, h, fe = 2048, 2, 1024, 2816
    routed_flops = 2.0 * s * k * h * fe * 3  # gate, up, down per routed token copy
    micro, d = 8, 8
    for dp, tp, ep, etp in ((8, 1, 8, 1), (4, 2, 4, 1), (8, 1, 2, 2), (2, 4, 1, 1)):
        per_device = sum(sum(grouped_gemm_times(device, peak, op, micro / dp, tp, (ep, etp, 1.0))) for op in ops)
        assert per_device * d * peak * device.gemm_efficiency == pytest.approx(3 * routed_flops * micro)
    one = sum(sum(grouped_gemm_times(device, peak, op, 1.0, 1, (8, 1, 1.0))) for op in ops)
    assert sum(sum(grouped_gemm_times(device, peak, op, 1.0, 1, (8, 1, 1.3))) for op in ops) == pytest.approx(1.3 * one)


def test_all_to_all_across_nodes_runs_at_one_network_link_per_rank():
    """16 ranks on 2 nodes: half of each rank's buffer crosses the network through its own NIC."""
    cluster = load_cluster("h100-80g:2x8")
    links = stage_links(cluster, 1, [Strategy(16, 1, ep=16), Strategy(16, 1, ep=8)])
    inter = cluster.device.inter
    nbytes = 64e6
    t = comm.all_to_all(nbytes, 16, links.ep[16, 1])
    assert t == pytest.approx(15 * inter.latency_s + (8 / 16) * nbytes / inter.bandwidth)
    assert links.ep[8, 1] == cluster.device.intra  # ep 8 stays inside a node


def test_expert_parallelism_trades_memory_for_exchange(model):
    cluster = load_cluster("h100-80g:1x8")
    workload = Workload(64, 2048)
    strategies = [Strategy(8, 1, ep=e) for e in (1, 2, 8)]
    links = stage_links(cluster, 1, strategies)
    layer = model.layers[2]
    costs = [layer_cost(layer, s, 8, cluster, workload, links) for s in strategies]
    ms = [c[2] for c in costs]
    assert ms[0] > ms[1] > ms[2]
    # ep 1: every device holds every expert and routes its own tokens (no exchange, the largest all-reduce)
    assert costs[0][1] > costs[2][1]


@pytest.mark.parametrize("seed", range(8))
def test_milp_over_expert_columns_matches_the_reference(model, seed):
    """Real tables of an MoE chain (dense embedding, head and block, two MoE blocks) with expert columns; the
    optimum of the MILP equals enumeration's, memory loose and tight."""
    rng = np.random.default_rng(seed)
    cluster = load_cluster("h100-80g:1x8")
    stages = int(rng.choice([1, 2]))
    micro_batches = int(rng.choice([4, 8]))
    workload = Workload(32, 2048)
    d = cluster.devices // stages
    pool = [s for s in enumerate_strategies(d, recompute=False, experts=8) if s.zero in (0, 1)]
    strategies = list(rng.choice(pool, size=min(6, len(pool)), replace=False))
    strategies += [Strategy(d, 1, ep=1), Strategy(d, 1, ep=2)]
    strategies = list(dict.fromkeys(strategies))
    program = build_program(model, cluster, workload, stages, micro_batches, strategies)
    if not program.allowed.any(axis=1).all():
        pytest.skip("no strategy fits some layer")
    assert_milp_equals_reference(program, float(np.quantile(program.Ms.max(axis=1), 0.5) * 3))


def test_planner_never_loses_to_megatron_grid_with_expert_parallelism(model):
    """Megatron-LM's grid searches ep too (one expert layout on every MoE block); the joint MILP is at least as
    good, since every uniform layout is one of its plans."""
    from uniap.baselines.common import stage_strategies
    from uniap.baselines.megatron import megatron_grid
    from uniap.planner import plan_search

    cluster, workload = load_cluster("h100-80g:1x8"), Workload(16, 2048)
    assert any(s.ep > 1 for s in stage_strategies(cluster, 1, experts=8))
    grid = megatron_grid(model, cluster, workload)
    plan = plan_search(model, cluster, workload, schedule="1f1b", workers=1)
    assert plan.predicted["iteration_time_s"] <= grid.iteration_time_s * (1 + 1e-9)
