"""Cost-model pieces, checked against numbers worked out by hand."""

import pytest

from uniap.cost import comm
from uniap.cost.memory import activation_bytes_per_sample, static_bytes
from uniap.cost.tables import reshard_time, send_time
from uniap.spec.cluster import Link
from uniap.spec.model import LayerSpec
from uniap.strategies import Strategy, enumerate_strategies

LINK = Link(latency_s=0.0, bandwidth=100e9)
SLOW = Link(latency_s=1e-3, bandwidth=1e9)


def test_ring_collectives_bus_factors():
    # all-reduce: 2(n−1)/n · B / bw = 2·3/4 · 1e9 / 1e11 = 15 ms
    assert comm.all_reduce(1e9, 4, LINK) == pytest.approx(0.015)
    # all-gather and reduce-scatter: (n−1)/n · B / bw = 7.5 ms
    assert comm.all_gather(1e9, 4, LINK) == pytest.approx(0.0075)
    assert comm.reduce_scatter(1e9, 4, LINK) == pytest.approx(0.0075)
    # all-reduce = reduce-scatter + all-gather (why sequence parallelism costs no extra bandwidth)
    assert comm.all_reduce(1e9, 8, SLOW) == pytest.approx(comm.reduce_scatter(1e9, 8, SLOW) + comm.all_gather(1e9, 8, SLOW))
    # latency: 2(n−1) steps of α for a ring all-reduce
    assert comm.all_reduce(0.0, 4, SLOW) == 0.0
    assert comm.all_reduce(1.0, 4, SLOW) == pytest.approx(6e-3 + 2 * 3 / 4 * 1 / 1e9)
    assert comm.all_reduce(1e9, 1, SLOW) == 0.0
    assert comm.p2p(1e9, SLOW) == pytest.approx(1e-3 + 1.0)


def _layer(**kw):
    base = dict(name="block.0", kind="block", params=1_000_000_000, tp_params=1_000_000_000, flops=0.0, tokens=2048,
                width=4096, act_tp=24.0, act_other=10.0, act_scores=5.0, act_input=2.0, out_elems=2048 * 4096,
                tp_comm_elems=2 * 2048 * 4096)
    base.update(kw)
    return LayerSpec(**base)


def test_static_memory_worked_example():
    layer = _layer()
    # tp=2 leaves 0.5e9 parameters per device; mixed-precision Adam is 2 + 2 + 12 = 16 B/param.
    assert static_bytes(layer, Strategy(4, 2, zero=0), "bf16") == pytest.approx(0.5e9 * 16)
    # ZeRO-1 shards the 12 B of optimizer state over dp=4: 2 + 2 + 3 = 7 B/param
    assert static_bytes(layer, Strategy(4, 2, zero=1), "bf16") == pytest.approx(0.5e9 * 7)
    # ZeRO-2 also the gradient: 2 + (2 + 12)/4 = 5.5 B/param
    assert static_bytes(layer, Strategy(4, 2, zero=2), "bf16") == pytest.approx(0.5e9 * 5.5)
    # ZeRO-3 everything: 16/4 = 4 B/param
    assert static_bytes(layer, Strategy(4, 2, zero=3), "bf16") == pytest.approx(0.5e9 * 4)
    # fp32 Adam: 4 + 4 + 8 = 16 B/param too
    assert static_bytes(layer, Strategy(1, 1), "fp32") == pytest.approx(1e9 * 16)
    # replicated parameters (norms) are not divided by tp
    half = _layer(tp_params=500_000_000)
    assert static_bytes(half, Strategy(1, 2), "bf16") == pytest.approx((0.25e9 + 0.5e9) * 16)


def test_activation_memory_follows_korthikanti():
    # per sample, in units of s·h: no tp: 24 + 10 + 5 (scores) = 34 + 5as/h analogue
    layer = _layer()
    assert activation_bytes_per_sample(layer, Strategy(1, 1), "bf16", flash_attention=False) == pytest.approx(39.0)
    # tp 8 without sp: 10 + 24/8 + 5/8 (replicated part stays)
    assert activation_bytes_per_sample(layer, Strategy(1, 8), "bf16", False) == pytest.approx(10 + 3 + 5 / 8)
    # with sp everything is divided by t: (34 + 5)/8
    assert activation_bytes_per_sample(layer, Strategy(1, 8, sp=True), "bf16", False) == pytest.approx(39 / 8)
    # flash attention drops the scores; fp32 doubles; full recompute keeps only the input
    assert activation_bytes_per_sample(layer, Strategy(1, 1), "bf16", True) == pytest.approx(34.0)
    assert activation_bytes_per_sample(layer, Strategy(1, 1), "fp32", True) == pytest.approx(68.0)
    assert activation_bytes_per_sample(layer, Strategy(1, 2, recompute=True), "bf16", True) == pytest.approx(2.0)


def test_resharding_is_free_within_a_layout_and_symmetric():
    a, b, c = Strategy(4, 2), Strategy(4, 2, zero=3, recompute=True), Strategy(8, 1)
    assert reshard_time(1e9, a, b, LINK) == 0.0
    # 4 → 8 batch pieces: one gather of the difference, same either way
    assert reshard_time(1e9, a, c, LINK) == pytest.approx(reshard_time(1e9, c, a, LINK))
    assert reshard_time(1e9, a, c, LINK) == pytest.approx(comm.all_gather(1e9 / 4, 2, LINK))
    # sends: each receiver gets its piece forward, each sender its piece's gradient back
    assert send_time(1e9, a, c, SLOW) == pytest.approx(2e-3 + 1e9 / 8 / 1e9 + 1e9 / 4 / 1e9)


def test_enumerated_strategies_cover_the_stage():
    strategies = enumerate_strategies(8)
    assert all(s.dp * s.tp == 8 for s in strategies)
    assert len(set(strategies)) == len(strategies)
    assert Strategy(8, 1, zero=3) in strategies and Strategy(1, 8, sp=True, recompute=True) in strategies
    assert all(s.zero == 0 for s in strategies if s.dp == 1)
    assert all(s.tp <= 2 for s in enumerate_strategies(8, max_tp=2))


def test_what_a_search_asks_again_is_kept_but_never_shared_wrongly():
    """`enumerate_strategies` and `stage_links` are kept per argument (a search asks for them for every pipeline
    configuration): a caller's list is its own, and another cluster never gets the first one's links."""
    from uniap.cost.tables import _stage_links, stage_links
    from uniap.spec.cluster import load_cluster

    first = enumerate_strategies(8)
    first.clear()
    assert enumerate_strategies(8) == enumerate_strategies(8) and len(enumerate_strategies(8)) > 0
    strategies = enumerate_strategies(16)
    slow, fast = load_cluster("a100-80g:4x8"), load_cluster("h100-80g:4x8")
    for cluster in (slow, fast, slow):
        assert stage_links(cluster, 2, strategies) == _stage_links(cluster, 2, strategies)
    assert stage_links(slow, 2, strategies) != stage_links(fast, 2, strategies)
    assert stage_links(slow, 2, strategies) is stage_links(slow, 2, list(reversed(strategies)))
