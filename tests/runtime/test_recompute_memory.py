"""Recompute levels keep what the cost model says they keep: benchmarks/recompute_memory.py measured small (sequence
128, micro-batch 2, tiny-llama, one process; its timings are printed by the benchmark, not asserted here)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def rows(benchmark_module):
    return benchmark_module("recompute_memory").measure(seq_len=128, micro_batch=2, steps=0)


def _by(rows, kernel):
    return {r["level"]: r for r in rows if r["kernel"] == kernel}


def test_standard_attention_keeps_less_with_each_level(rows):
    kept = {level: r["measured"] for level, r in _by(rows, "standard").items()}
    assert kept["none"] > kept["selective"] > kept["full"] > 0
    modelled = {level: r["model"] for level, r in _by(rows, "standard").items()}
    assert modelled["none"] > modelled["selective"] > modelled["full"]


def test_selective_recompute_drops_the_scores_the_cost_model_drops(benchmark_module, rows):
    """Selective saves exactly the standard kernel's softmax(QKᵀ) (fp32, heads·s² per sample and block) and, with
    flash attention, which keeps none, next to nothing (its log-sum-exp); full saves what the model says to 2 %."""
    for s in benchmark_module("recompute_memory").savings(rows):
        if s["kernel"] == "flash" and s["level"] == "selective":
            assert s["model"] == 0 and s["measured"] < 0.01 * _by(rows, "flash")["none"]["measured"]
        else:
            assert s["measured"] == pytest.approx(s["model"], rel=0.02), s


def test_the_cost_model_prices_each_level_slower(rows):
    for kernel in ("standard", "flash"):
        t = {level: r["model_step_s"] for level, r in _by(rows, kernel).items()}
        assert t["none"] < t["selective"] < t["full"], kernel
