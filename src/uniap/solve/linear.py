"""A solver-neutral sparse MILP: what the linear back-ends (HiGHS, Gurobi) load.

Every row has a name by meaning: its kind ("memory", "one_strategy", …) and the indices it is for
(`named("memory", stage=2)`, shown as "memory[stage=2]"). Names are kept as (kind, ((label, value), …)) tuples
and formatted only when shown (`label`), so naming costs the model builders next to nothing. `conflict_line`
turns the rows (and column families) of an irreducible infeasible subset into one line that names their kinds.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

Expr = tuple[np.ndarray, np.ndarray]
"""A linear expression: (variable indices, coefficients), duplicates allowed (they add up)."""

RowName = tuple[str, tuple[tuple[str, int], ...]]
"""A row's name: its kind and its indices as (label, value) pairs, e.g. ("memory", (("stage", 2),))."""

Row = tuple[Expr, float, float, RowName]
"""A row to add to a loaded model: (expression, lower bound, upper bound, name)."""


def named(kind: str, **at: int) -> RowName:
    """The name of a row of `kind` at the given indices: named("memory", stage=2) is "memory[stage=2]"."""
    return kind, tuple(at.items())


def label(name: RowName) -> str:
    """A name as text: "memory[stage=2]", or the bare kind when it has no indices."""
    kind, at = name
    return f"{kind}[{','.join(f'{k}={v}' for k, v in at)}]" if at else kind


def conflict_line(rows: list[RowName], columns: list[str] = (), meaning: dict[str, str] | None = None) -> str:
    """One line naming the kinds of rows in a conflict (an irreducible infeasible subset), with counts, in order
    of first appearance: "memory[stage=0..3] (4 rows) conflict with one_strategy (12 rows)"; `columns` are the
    variable families (Builder.variables' names) whose bounds take part, shown by their name before any "[",
    with what `meaning` says of it: "and the bounds of m (layers per stage) (2 columns)"."""
    kinds: dict[str, list[tuple[tuple[str, int], ...]]] = {}
    for kind, at in rows:
        kinds.setdefault(kind, []).append(at)
    parts = [f"{_span(kind, ats)} ({len(ats)} row{'s' if len(ats) != 1 else ''})" for kind, ats in kinds.items()]
    verb = "conflicts" if rows and len(next(iter(kinds.values()))) == 1 else "conflict"
    bounds = ""
    if columns:
        bases = dict.fromkeys(family.split("[")[0] for family in columns)
        families = ", ".join(f"{base} ({meaning[base]})" if meaning and base in meaning else base for base in bases)
        bounds = f"the bounds of {families} ({len(columns)} column{'s' if len(columns) != 1 else ''})"
    if not parts:
        return bounds or "no rows"
    line = parts[0]
    if len(parts) > 1:
        line += f" {verb} with " + ", ".join(parts[1:]) + (f" and {bounds}" if bounds else "")
    elif bounds:
        line += f" {verb} with {bounds}"
    else:
        line += f" {verb} among themselves" if len(rows) > 1 else " is infeasible alone"
    return line


def _span(kind: str, ats: list[tuple[tuple[str, int], ...]]) -> str:
    """A kind with the indices its rows take: "memory[stage=0..3]", "edges_in[run=1,stage=0,2]"."""
    keys = {tuple(k for k, _ in at) for at in ats}
    if len(keys) != 1 or not next(iter(keys)):
        return kind
    shown = []
    for j, key in enumerate(next(iter(keys))):
        values = sorted({int(at[j][1]) for at in ats})
        if len(values) > 1 and values == list(range(values[0], values[-1] + 1)):
            shown.append(f"{key}={values[0]}..{values[-1]}")
        else:
            shown.append(f"{key}={','.join(map(str, values[:6]))}{',…' if len(values) > 6 else ''}")
    return f"{kind}[{','.join(shown)}]"


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
    names: tuple[RowName, ...] = field(default=(), compare=False)
    """Each row's name (linear.named), in row order."""
    families: tuple[tuple[int, str], ...] = field(default=(), compare=False)
    """(first column, name) of each block of variables, in column order."""

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

    def only(self, keep: np.ndarray) -> LinearModel:
        """The same columns with only the rows where `keep` (a bool mask over the rows) holds."""
        keep = np.asarray(keep, dtype=bool)
        lengths = np.diff(self.start)
        entries = np.repeat(keep, lengths)
        start = np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64)
        return LinearModel(cost=self.cost, lb=self.lb, ub=self.ub, integer=self.integer, start=start,
                           index=self.index[entries], value=self.value[entries], row_lo=self.row_lo[keep],
                           row_hi=self.row_hi[keep], names=tuple(n for n, k in zip(self.names, keep) if k),
                           families=self.families)

    def row_name(self, i: int) -> str:
        """Row i's name as text ("memory[stage=2]")."""
        return label(self.names[i])

    def kinds(self) -> dict[str, int]:
        """Rows per kind, in order of first appearance."""
        return dict(Counter(kind for kind, _ in self.names))

    def family(self, column: int) -> str:
        """The name of the block of variables that holds `column`."""
        starts = [first for first, _ in self.families]
        return self.families[int(np.searchsorted(starts, column, side="right")) - 1][1]


class Builder:
    """Accumulates variables, rows and objective terms; `model()` freezes them into a LinearModel."""

    def __init__(self):
        self.columns = 0
        self._bounds: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._rows: list[Expr] = []
        self._lo: list[float] = []
        self._hi: list[float] = []
        self._names: list[RowName] = []
        self._families: list[tuple[int, str]] = []
        self._objective: list[Expr] = []

    def variables(self, shape, lb=0.0, ub=math.inf, integer=False, name: str = "") -> np.ndarray:
        """New variables as an index array of `shape`; lb/ub broadcast to it. `name` (e.g. "n[run=2]") is what
        a conflict through their bounds calls them."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        size = math.prod(shape)
        index = np.arange(self.columns, self.columns + size, dtype=np.int64).reshape(shape)
        if size:
            self._families.append((self.columns, name or "unnamed"))
        self.columns += size
        self._bounds.append((np.broadcast_to(np.asarray(lb, dtype=float), shape).ravel(),
                             np.broadcast_to(np.asarray(ub, dtype=float), shape).ravel(),
                             np.full(size, bool(integer))))
        return index

    def row(self, expr: Expr, lo=-math.inf, hi=math.inf, *, name: RowName) -> None:
        """The row lo ≤ expr ≤ hi, `name`d by meaning (linear.named)."""
        self._rows.append(expr)
        self._lo.append(lo)
        self._hi.append(hi)
        self._names.append(name)

    def rows(self, rows: list[Row]) -> None:
        """Several named rows, as (expression, lo, hi, name)."""
        for expr, lo, hi, name in rows:
            self.row(expr, lo, hi, name=name)

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
                           value=value, row_lo=np.array(self._lo, dtype=float), row_hi=np.array(self._hi, dtype=float),
                           names=tuple(self._names), families=tuple(self._families))


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
