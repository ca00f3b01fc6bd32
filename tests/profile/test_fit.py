"""Fits the profile relies on: lines through medians, α–β links, Kendall τ."""

import math

import numpy as np
import pytest

from uniap.errors import UniapError
from uniap.demo import kendall_tau, ranks
from uniap.profile.fit import fit_line, fit_link, ring_terms


def test_line_recovers_intercept_and_slope_from_noisy_data():
    rng = np.random.default_rng(0)
    x = np.repeat([1.0, 2.0, 4.0, 8.0], 5)
    y = 0.012 + 0.003 * x + rng.normal(0, 2e-4, x.size)
    line = fit_line(x, y)
    assert line.a == pytest.approx(0.012, abs=5e-4)
    assert line.b == pytest.approx(0.003, rel=0.05)
    assert line.r2 > 0.99
    assert line(16) == pytest.approx(line.a + 16 * line.b)


def test_line_never_goes_negative():
    # a falling series (noise around a constant) pins the slope to 0 and keeps the mean
    flat = fit_line([1, 2, 4], [0.012, 0.011, 0.010])
    assert flat.b == 0 and flat.a == pytest.approx(0.011)
    # a line through the origin pins the intercept, not the slope
    origin = fit_line([1, 2, 4], [0.0, 0.009, 0.03])
    assert origin.a == 0 and origin.b > 0
    # one distinct size: through the origin
    one = fit_line([4, 4], [0.02, 0.02])
    assert one.a == 0 and one.b == pytest.approx(0.005)


def test_line_rejects_bad_input():
    with pytest.raises(UniapError):
        fit_line([], [])
    with pytest.raises(UniapError):
        fit_line([1, 2], [1.0])
    with pytest.raises(UniapError):
        fit_line([1, 2], [1.0, math.nan])


def test_alpha_beta_link_recovered_from_ring_collectives():
    alpha, bw = 40e-6, 2e9
    points = []
    for op in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        for n in (2, 4):
            for nbytes in (16e3, 256e3, 1e6, 4e6):
                steps, factor = ring_terms(op, n)
                points.append((op, n, nbytes, steps * alpha + factor * nbytes / bw))
    got_alpha, got_bw = fit_link(points)
    assert got_alpha == pytest.approx(alpha, rel=1e-6)
    assert got_bw == pytest.approx(bw, rel=1e-6)


def test_alpha_beta_without_size_dependence_is_latency_only():
    alpha, bw = fit_link([("p2p", 2, b, 1e-3) for b in (1e3, 1e4, 1e5)])
    assert bw > 1e12 or math.isinf(bw)
    assert alpha == pytest.approx(1e-3, rel=0.05)


def test_kendall_tau_and_ranks():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # one swapped pair of 6: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert ranks([0.3, 0.1, 0.2]) == [3, 1, 2]
