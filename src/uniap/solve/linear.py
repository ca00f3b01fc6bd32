"""A solver-neutral sparse MILP: what the linear back-ends (HiGHS, Gurobi) load."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Expr = tuple[np.ndarray, np.ndarray]
"""A linear expression: (variable indices, coefficients), duplicates allowed (they add up)."""


def term(index, coef=1.0) -> Expr:
    """Expression Σ coef·x[index] over an index array of any shape (coef broadcast to it)."""
    index = np.asarray(index, dtype=np.int64)
    return index.ravel(), np.broadcast_to(np.asarray(coef, dtype=float), index.shape).ravel().copy()


def plus(*exprs: Expr) -> Expr:
    if not exprs:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    return np.concatenate([e[0] for e in exprs]), np.concatenate([e[1] for e in exprs])


def minus(expr: Expr) -> Expr:
    return expr[0], -expr[1]


def scaled(expr: Expr, factor: float) -> Expr:
    return expr if factor == 1 else (expr[0], expr[1] * factor)


@dataclass(frozen=True)
class LinearModel:
    """min cost·x s.t. row_lo ≤ A x ≤ row_hi, lb ≤ x ≤ ub, x[integer] integral; A row-wise (CSR)."""

    cost: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    integer: np.ndarray
    start: np.ndarray
    index: np.ndarray
    value: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray

    @property
    def columns(self) -> int:
        return len(self.cost)

    @property
    def rows(self) -> int:
        return len(self.row_lo)

    def activity(self, x: np.ndarray) -> np.ndarray:
        """A x, row by row (for checking a point against the rows)."""
        out = np.zeros(self.rows)
        np.add.at(out, np.repeat(np.arange(self.rows), np.diff(self.start)), self.value * x[self.index])
        return out


class Builder:
    """Accumulates variables, rows and objective terms; `model()` freezes them into a LinearModel."""

    def __init__(self):
        self.columns = 0
        self._bounds: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._rows: list[Expr] = []
        self._lo: list[float] = []
        self._hi: list[float] = []
        self._objective: list[Expr] = []

    def variables(self, shape, lb=0.0, ub=math.inf, integer=False) -> np.ndarray:
        """New variables as an index array of `shape`; lb/ub broadcast to it."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        size = math.prod(shape)
        index = np.arange(self.columns, self.columns + size, dtype=np.int64).reshape(shape)
        self.columns += size
        self._bounds.append((np.broadcast_to(np.asarray(lb, dtype=float), shape).ravel(),
                             np.broadcast_to(np.asarray(ub, dtype=float), shape).ravel(),
                             np.full(size, bool(integer))))
        return index

    def row(self, expr: Expr, lo=-math.inf, hi=math.inf) -> None:
        self._rows.append(expr)
        self._lo.append(lo)
        self._hi.append(hi)

    def minimise(self, expr: Expr) -> None:
        self._objective.append(expr)

    def model(self) -> LinearModel:
        lb, ub, integer = (np.concatenate([b[i] for b in self._bounds]) if self._bounds else np.zeros(0)
                           for i in range(3))
        cost = np.zeros(self.columns)
        for index, coef in self._objective:
            np.add.at(cost, index, coef)
        start, index, value = csr(self._rows)
        return LinearModel(cost=cost, lb=lb, ub=ub, integer=integer.astype(bool), start=start, index=index,
                           value=value, row_lo=np.array(self._lo, dtype=float), row_hi=np.array(self._hi, dtype=float))


def csr(rows: list[Expr]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise sparse arrays of expressions, duplicate indices within a row summed, zeros dropped."""
    start, indices, values = [0], [], []
    for index, coef in rows:
        unique, inverse = np.unique(index, return_inverse=True)
        summed = np.zeros(len(unique))
        np.add.at(summed, inverse, coef)
        nonzero = summed != 0
        indices.append(unique[nonzero])
        values.append(summed[nonzero])
        start.append(start[-1] + int(nonzero.sum()))
    if not rows:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    return np.array(start, dtype=np.int64), np.concatenate(indices), np.concatenate(values)
