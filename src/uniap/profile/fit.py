"""Fits of measured figures (numpy only, no torch): lines, α–β links and device figures.

Timings on a shared machine are noisy (2–4× run to run on 2 cores), so every fit is a least-squares
line through the *medians* of the repetitions, constrained to non-negative coefficients (a negative
fixed cost or a negative per-sample cost has no physical meaning and would let the solver exploit
noise): if the free fit has a negative coefficient, that coefficient is pinned to 0 and the other
one refitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uniap.errors import UniapError


@dataclass(frozen=True)
class Line:
    """y = a + b·x, fitted to points (x, y); `r2` is the coefficient of determination (1 with < 3 points)."""

    a: float
    b: float
    r2: float

    def __call__(self, x: float) -> float:
        return self.a + self.b * x

    def to_json(self) -> dict:
        return {"a": self.a, "b": self.b, "r2": self.r2}

    @classmethod
    def from_json(cls, data: dict) -> Line:
        return cls(float(data["a"]), float(data["b"]), float(data.get("r2", 1.0)))


def fit_line(x, y) -> Line:
    """Least-squares y = a + b·x with a, b >= 0. One distinct x: a line through the origin and that point's mean."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise UniapError(f"a line fit needs matching, non-empty x and y (got {x.size} and {y.size} points)")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise UniapError("a line fit needs finite numbers")
    if np.unique(x).size < 2:
        xm = float(x.mean())
        if xm == 0:
            return Line(max(float(y.mean()), 0.0), 0.0, 1.0)
        return Line(0.0, max(float(y.mean()) / xm, 0.0), 1.0)
    A = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    if b < 0:  # pin the slope, keep the mean
        a, b = max(float(y.mean()), 0.0), 0.0
    elif a < 0:  # pin the intercept: least squares through the origin
        a, b = 0.0, max(float(x @ y) / float(x @ x), 0.0)
    pred = a + b * x
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return Line(float(a), float(b), r2)


# Ring-algorithm step counts and bus factors (cost.comm): time = steps(n)·α + factor(n)·bytes/bandwidth.
def ring_terms(op: str, n: int) -> tuple[float, float]:
    if op == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return float(n - 1), (n - 1) / n
    if op == "p2p":
        return 1.0, 1.0
    raise UniapError(f"unknown collective {op!r}")


def fit_link(points) -> tuple[float, float]:
    """One (α, bandwidth) for all measured collectives under the ring model.

    points: iterable of (op, n, bytes, seconds). Least squares of seconds = steps·α + factor·bytes·(1/bw),
    both coefficients >= 0. Returns (latency_s, bandwidth bytes/s); bandwidth is inf if no size dependence
    was measurable.
    """
    rows, ys = [], []
    for op, n, nbytes, secs in points:
        steps, factor = ring_terms(op, int(n))
        rows.append((steps, factor * float(nbytes)))
        ys.append(float(secs))
    if not rows:
        raise UniapError("no collective measurements to fit a link to")
    A = np.asarray(rows)
    y = np.asarray(ys)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    alpha, inv_bw = (float(c) for c in coef)
    if alpha < 0:
        alpha, inv_bw = 0.0, max(float(A[:, 1] @ y) / float(A[:, 1] @ A[:, 1]), 0.0)
    elif inv_bw < 0:
        inv_bw, alpha = 0.0, max(float(A[:, 0] @ y) / float(A[:, 0] @ A[:, 0]), 0.0)
    return alpha, (1.0 / inv_bw if inv_bw > 0 else math.inf)


def median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float)))
