"""Per-operator pricing: GEMM shapes, attention kernels, memory-bound work, overlap — checked by hand."""

from dataclasses import replace

import pytest

from uniap.cost.compute import (attention_times, elementwise_time, gemm_efficiency, gemm_time, layer_time,
                                overlapped)
from uniap.spec import load_model
from uniap.spec.cluster import DEVICE_TYPES
from uniap.spec.engine import Engine
from uniap.spec.ops import Attention

A100 = DEVICE_TYPES["a100-80g"]
PEAK = 312e12
EAGER, FUSED = Engine("eager", "flash"), Engine("fused", "flash")


def test_gemm_wave_and_tile_quantisation():
    plain = replace(A100, gemm_half_k=0.0)
    # 108 SMs, tiles 256×128: m=256·108, n=128 is exactly one full wave → the device's GEMM efficiency
    assert gemm_efficiency(plain, 256 * 108, 128, 4096) == pytest.approx(A100.gemm_efficiency)
    # one tile more needs a second wave that holds a single tile: 109 tiles over 2·108 slots
    assert gemm_efficiency(plain, 256 * 109, 128, 4096) == pytest.approx(A100.gemm_efficiency * 109 / 216)
    # half-empty edge tiles: m = 128 fills half of each 256-row tile
    assert gemm_efficiency(plain, 128, 128 * 108, 4096) == pytest.approx(A100.gemm_efficiency * 0.5)
    # a short inner dimension: k = k½ halves the efficiency
    assert gemm_efficiency(A100, 256 * 108, 128, 64) == pytest.approx(A100.gemm_efficiency / 2)
    t = gemm_time(plain, PEAK, 256 * 108, 128, 4096)
    assert t == pytest.approx(2 * 256 * 108 * 128 * 4096 / (PEAK * A100.gemm_efficiency) + A100.kernel_gap_s)


def test_flash_attention_halves_causal_work_and_standard_costs_more():
    op = Attention(heads=32, head_dim=128, queries=4096, keys=4096, causal=True)
    full = replace(op, causal=False)
    f_causal, b_causal = attention_times(A100, EAGER, PEAK, op, 1, 1, 1.0)
    f_full, _ = attention_times(A100, EAGER, PEAK, full, 1, 1, 1.0)
    work = 4 * 4096 * 4096 * 128 * 32
    assert f_full - A100.kernel_gap_s == pytest.approx(work / (PEAK * A100.attention_efficiency[0]))
    assert f_causal - A100.kernel_gap_s == pytest.approx(work / 2 / (PEAK * A100.attention_efficiency[0]))
    assert b_causal - A100.kernel_gap_s == pytest.approx(2.5 * work / 2 / (PEAK * A100.attention_efficiency[1]))
    standard, _ = attention_times(A100, Engine("eager", "standard"), PEAK, op, 1, 1, 1.0)
    assert standard > f_full  # the whole score matrix, plus a softmax streamed through memory
    # tp splits the heads
    f_tp, _ = attention_times(A100, EAGER, PEAK, op, 1, 4, 1.0)
    assert f_tp - A100.kernel_gap_s == pytest.approx((f_causal - A100.kernel_gap_s) / 4)


def test_eager_moves_more_bytes_than_fused():
    n = 1e8
    eager = elementwise_time(A100, EAGER, "rmsnorm", n)
    fused = elementwise_time(A100, FUSED, "rmsnorm", n)
    assert fused == pytest.approx(4 * n / (A100.memory_bandwidth * 0.85) + A100.kernel_gap_s)
    assert eager == pytest.approx(28 * n / (A100.memory_bandwidth * 0.85) + 5 * A100.kernel_gap_s)
    assert elementwise_time(A100, EAGER, "norm", n) == elementwise_time(A100, FUSED, "norm", n)  # LayerNorm
    assert elementwise_time(replace(A100, elementwise=False), EAGER, "rmsnorm", n) == 0.0


def test_layer_time_orders_engines_recompute_and_tp():
    block = load_model("llama3-8b", 8192).layers[1]
    base = layer_time(A100, EAGER, PEAK, block, 1, 1, False, "none")
    assert layer_time(A100, FUSED, PEAK, block, 1, 1, False, "none") < base
    assert layer_time(A100, EAGER, PEAK, block, 1, 1, False, "full") == pytest.approx(base * 4 / 3, rel=0.05)
    # selective recompute re-runs the attention kernel alone: between none and full, by exactly its forward
    (attention_fwd, _), = [attention_times(A100, EAGER, PEAK, op, 1, 1, 1.0) for op in block.ops
                           if isinstance(op, Attention)]
    assert layer_time(A100, EAGER, PEAK, block, 1, 1, False, "selective") == pytest.approx(base + attention_fwd)
    # tp 8 splits the GEMMs and attention but not the norms and residuals, so it is more than 1/8
    assert base / 8 < layer_time(A100, EAGER, PEAK, block, 1, 8, False, "none") < base / 4
    # sequence parallelism splits those too
    assert layer_time(A100, EAGER, PEAK, block, 1, 8, True, "none") < layer_time(A100, EAGER, PEAK, block, 1, 8,
                                                                                  False, "none")


def test_overlap_counts_only_the_exposed_part():
    assert overlapped(1.0, 0.4, 0.0) == 1.0
    assert overlapped(1.0, 1.5, 0.0) == 1.5
    assert overlapped(1.0, 0.4, 0.1) == pytest.approx(1.04)
