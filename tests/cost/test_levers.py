"""Selective recomputation, context parallelism and fp8 GEMMs in the cost model, and the MILP over their columns
against the enumeration oracle."""

import dataclasses

import numpy as np
import pytest

from reference_check import assert_milp_equals_reference
from uniap.cost.compute import attention_seconds, layer_time
from uniap.cost.memory import activation_bytes_per_sample, static_bytes
from uniap.cost.tables import build_program, compute_peaks, disallowed, layer_cost, layer_compute, stage_links, \
    weight_gradient_seconds
from uniap.planner import plan_search
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.engine import Engine
from uniap.spec.ops import Attention, Gemm
from uniap.spec.workload import Workload
from uniap.strategies import Strategy, context_degrees, enumerate_strategies


@pytest.fixture(scope="module")
def llama():
    return load_model("llama3-8b", 8192)


def block(model):
    return next(layer for layer in model.layers if layer.kind == "block")


def test_strategy_json_names_the_level_and_reads_old_plans():
    s = Strategy(dp=2, tp=2, zero=1, recompute="selective", cp=2)
    assert s.devices == 8 and s.replicas == 4
    assert s.label() == "dp2·cp2·tp2·z1·sel"
    assert Strategy(8, 1, recompute="selective-op").label() == "dp8·selop"
    data = s.to_json()
    assert data["recompute"] == "selective" and data["cp"] == 2
    assert Strategy.from_json(data) == s
    assert Strategy.from_json({"dp": 4, "tp": 1, "recompute": True}).recompute == "full"  # plans before the levels
    assert "cp" not in Strategy(4, 1).to_json()
    assert Strategy(4, 1, recompute=True) == Strategy(4, 1, recompute="full")


def test_selective_drops_the_scores_and_reruns_the_attention_alone(llama):
    layer = block(llama)
    none, sel, full = (Strategy(1, 1, recompute=r) for r in ("none", "selective", "full"))
    # standard attention keeps the score matrix; selective recompute drops exactly that
    mem = {s.recompute: activation_bytes_per_sample(layer, s, "bf16", flash_attention=False) for s in (none, sel, full)}
    assert mem["none"] - mem["selective"] == pytest.approx(layer.act_scores)
    assert mem["none"] > mem["selective"] > mem["full"]
    # flash attention keeps no scores: selective saves nothing (the planner's dominance pruning drops it)
    assert activation_bytes_per_sample(layer, sel, "bf16", True) == activation_bytes_per_sample(layer, none, "bf16",
                                                                                                   True)
    cluster, workload = load_cluster("a100-80g:1x8"), Workload(8, 8192)
    times = {s.recompute: layer_compute(layer, s, 1, cluster, workload) for s in (none, sel, full)}
    attention_fwd, _ = attention_seconds(cluster.device, cluster.engine, cluster.peak("bf16"), layer, 1, 1)
    assert times["selective"] - times["none"] == pytest.approx(attention_fwd)
    assert times["none"] < times["selective"] < times["full"]
    assert disallowed(llama.layers[0], sel, 1) is not None  # the embedding has no attention core


def test_op_policy_keeps_half_the_gemm_outputs_and_recomputes_the_rest(llama):
    """torchtitan's op policy: between none and full in memory and time, and its recomputation is half of the GEMMs'
    forward plus every element-wise forward."""
    layer = block(llama)
    cluster, workload = load_cluster("h100-80g:1x8"), Workload(8, 8192)
    levels = ("none", "selective-op", "full")
    mem = [activation_bytes_per_sample(layer, Strategy(1, 1, recompute=r), "bf16", True) for r in levels]
    assert mem[0] > mem[1] > mem[2]
    gemm_outputs = sum(2.0 * op.count * op.rows * op.n for op in layer.ops if isinstance(op, Gemm))
    assert mem[1] - mem[2] == pytest.approx(gemm_outputs / 2 + sum(
        op.queries * op.heads * (2.0 * op.head_dim + 4.0) for op in layer.ops if isinstance(op, Attention)))
    times = [layer_compute(layer, Strategy(1, 1, recompute=r), 1, cluster, workload) for r in levels]
    assert times[0] < times[1] < times[2]


def test_context_parallelism_splits_tokens_and_shards_states_over_dp_cp(llama):
    layer = block(llama)
    cluster, workload = load_cluster("h100-80g:1x8"), Workload(8, 8192)
    one, cp4 = Strategy(8, 1, zero=1), Strategy(2, 1, zero=1, cp=4)
    # per sample of the dp shard, a cp rank keeps a quarter of the activations
    assert activation_bytes_per_sample(layer, cp4, "bf16", True) == pytest.approx(
        activation_bytes_per_sample(layer, one, "bf16", True) / 4)
    # ZeRO shards over the dp·cp ranks that hold the same parameters: the same states as dp8
    assert static_bytes(layer, cp4, "bf16") == pytest.approx(static_bytes(layer, one, "bf16"))
    # one device computes the same tokens under dp8 (1 sample) and dp2·cp4 (a quarter of 4 samples)
    assert layer_compute(layer, cp4, 8, cluster, workload) == pytest.approx(layer_compute(layer, one, 8, cluster,
                                                                                           workload))
    assert disallowed(layer, Strategy(1, 1, cp=3), 1) is not None  # 8192 tokens do not split into 6 chunks


def test_key_value_exchange_hides_behind_long_attention_only():
    """The ring's transfer grows with s/cp and the attention it hides behind with (s/cp)·s: at 64K tokens the
    exchange is hidden, at 2K it is exposed."""
    cluster = load_cluster("h100-80g:2x8")
    exposed = {}
    for seq in (2048, 65536):
        model = load_model("llama3-8b", seq)
        layer = block(model)
        workload = Workload(16, seq)
        s = Strategy(1, 1, cp=16)
        links = stage_links(cluster, 1, [s])
        a = layer_cost(layer, s, 1, cluster, workload, links)[0]
        exposed[seq] = a - layer_compute(layer, s, 1, cluster, workload)
    assert exposed[65536] == pytest.approx(0.0, abs=1e-12)
    assert exposed[2048] > 0


def test_search_tries_cp_only_where_each_rank_keeps_long_chunks():
    assert context_degrees(8, 4096) == (1,)
    assert context_degrees(64, 131072) == (1, 2, 4, 8, 16, 32)
    assert context_degrees(8, 8192) == (1, 2)
    strategies = enumerate_strategies(8, context=(1, 2))
    assert {s.cp for s in strategies} == {1, 2} and all(s.devices == 8 for s in strategies)


def test_fp8_runs_block_gemms_faster_and_pays_their_casts(llama):
    layer, head = block(llama), llama.layers[-1]
    cluster, s = load_cluster("h100-80g:1x8"), Strategy(1, 1)
    bf16, fp8 = Workload(8, 8192, "bf16"), Workload(8, 8192, "fp8")
    assert layer_compute(layer, s, 1, cluster, fp8) < layer_compute(layer, s, 1, cluster, bf16)
    assert compute_peaks(cluster, fp8, head) == (cluster.peak("bf16"), 0.0)  # the LM head stays 16-bit
    assert layer_compute(head, s, 1, cluster, fp8) == pytest.approx(layer_compute(head, s, 1, cluster, bf16))
    # the casts are memory-bound time: a device with no HBM cost would be faster by exactly them
    peak, fp8_peak = compute_peaks(cluster, fp8, layer)
    casts_free = dataclasses.replace(cluster.device, memory_bandwidth=1e30, kernel_gap_s=0.0)
    with_casts = layer_time(dataclasses.replace(cluster.device, kernel_gap_s=0.0), cluster.engine, peak, layer, 1, 1,
                            False, "none", fp8_peak=fp8_peak)
    assert layer_time(casts_free, cluster.engine, peak, layer, 1, 1, False, "none", fp8_peak=fp8_peak) < with_casts
    assert static_bytes(layer, s, "fp8") == static_bytes(layer, s, "bf16")
    # a zero-bubble schedule's weight pass runs the block's weight GEMMs in fp8 too (the first search of an fp8
    # workload with zero bubble in it found this path broken)
    assert 0 < weight_gradient_seconds(layer, s, 1, cluster, fp8) < weight_gradient_seconds(layer, s, 1, cluster, bf16)


@pytest.mark.parametrize("seed", range(6))
def test_milp_over_selective_and_cp_columns_matches_the_reference(seed):
    """Real tables of a long-sequence chain under standard attention (where selective recompute pays) with
    none/selective/full and cp 1/2/4 columns; the MILP's optimum equals enumeration's, memory loose and tight."""
    rng = np.random.default_rng(seed)
    model = load_model("llama3-8b", 16384)
    model = dataclasses.replace(model, layers=model.layers[:2] + model.layers[-2:])
    cluster = dataclasses.replace(load_cluster("a100-80g:1x8"), engine=Engine("fused", "standard"))
    stages = int(rng.choice([1, 2]))
    micro_batches = int(rng.choice([2, 4]))
    workload = Workload(8, 16384)
    d = cluster.devices // stages
    pool = [s for s in enumerate_strategies(d, context=(1, 2, 4)) if s.zero in (0, 1) and not s.sp]
    strategies = list(rng.choice(pool, size=min(7, len(pool)), replace=False))
    strategies += [Strategy(d, 1), Strategy(d // 2, 1, recompute="selective", cp=2),
                   Strategy(d // 2, 1, recompute="full", cp=2)]
    strategies = list(dict.fromkeys(strategies))
    program = build_program(model, cluster, workload, stages, micro_batches, strategies)
    if not program.allowed.any(axis=1).all():
        pytest.skip("no strategy fits some layer")
    assert_milp_equals_reference(program, float(np.quantile((program.Ms + program.Ma).max(axis=1), 0.5) * 2))


def test_long_context_plan_uses_cp_and_beats_the_best_plan_without_it():
    """The README's example: Llama 3 8B at 128K tokens on 64 H100, 8 sequences per step."""
    model, cluster = load_model("llama3-8b", 131072), load_cluster("h100-80g:8x8")
    workload = Workload(8, 131072)
    with_cp = plan_search(model, cluster, workload, workers=1)
    without = plan_search(model, cluster, workload, workers=1, max_cp=1)
    assert any(layer.strategy.cp > 1 for layer in with_cp.layers)
    assert all(layer.strategy.cp == 1 for layer in without.layers)
    assert with_cp.predicted["iteration_time_s"] < without.predicted["iteration_time_s"]


def test_tp_overlap_hides_sequence_parallel_collectives_behind_compute(llama):
    layer = block(llama)
    plain = load_cluster("h100-80g:1x8")
    overlap = dataclasses.replace(plain, engine=dataclasses.replace(plain.engine, tp_overlap=True))
    workload = Workload(8, 8192)
    sp, no_sp = Strategy(1, 8, sp=True), Strategy(1, 8)
    compute = layer_compute(layer, sp, 1, plain, workload)
    exposed = {c.engine.tp_overlap: layer_cost(layer, sp, 1, c, workload, stage_links(c, 1, [sp]))[0] - compute
               for c in (plain, overlap)}
    assert 0 < exposed[True] < exposed[False]
    # overlapped: only the slowdown the traffic inflicts on compute remains
    assert exposed[True] == pytest.approx(plain.device.overlap_slowdown * exposed[False])
    # without sequence parallelism the engines keep tp's all-reduces on the critical path
    assert layer_cost(layer, no_sp, 1, overlap, workload, stage_links(overlap, 1, [no_sp]))[0] == pytest.approx(
        layer_cost(layer, no_sp, 1, plain, workload, stage_links(plain, 1, [no_sp]))[0])


def test_sdpa_attention_runs_pytorchs_kernel_under_fused_kernels(llama):
    layer = block(llama)
    fused = dataclasses.replace(load_cluster("h100-80g:1x8"), engine=Engine("fused", "flash"))
    sdpa = dataclasses.replace(fused, engine=Engine("fused", "sdpa"))
    eager = dataclasses.replace(fused, engine=Engine("eager", "flash"))
    peak = fused.peak("bf16")
    seconds = {name: attention_seconds(c.device, c.engine, peak, layer, 1, 1)[0]
               for name, c in (("fused", fused), ("sdpa", sdpa), ("eager", eager))}
    assert seconds["sdpa"] == pytest.approx(seconds["eager"]) and seconds["fused"] < seconds["sdpa"]
