"""Shrink a program before it becomes a MILP: fold repeated layers, merge layouts, drop dominated strategies.

* **Runs** (TAP's folding): a maximal stretch of consecutive layers with identical rows (A, G, Ms, Ma, allowed)
  and identical edges between them (R, Rp) is one run. Its layers are interchangeable, so the MILP only needs
  how many of them each stage runs under each strategy, plus how often the layout changes between neighbours.
  Runs are found from the arrays, not from `program.group`: equal arrays are what makes folding exact, and a
  group id that promises more than the arrays hold cannot then make the MILP wrong.
* **Layout classes**: strategies of a run whose rows and columns of every adjacent R and Rp are equal (in the real
  cost model: same tp / sequence-parallel layout, whatever zero and recompute are) cost the same at every edge, so
  the MILP counts transitions between classes, not strategies.
* **Dominance**: within a class, a strategy no better than another in A, G, Ms and Ma is never needed (with a
  split backward also in its weight pass and its input pass: the time rises with each, solve.program).
* **One strategy per device group** (interleaved programs only): the layers of a stretch of identical layers that
  one device group holds share one strategy, in all of its chunks. The search space says so, not the cost model
  (`evaluate` prices any plan): a group whose chunks mix strategies makes the slot term depend on how they are
  packed into chunks, which no bound over the group's contents sees, and interleaved searches then took minutes.

Every table entry of a disallowed strategy is zeroed here, so later code never meets the inf/nan a cost model may
store there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from uniap.program import StageProgram
from uniap.solve.program import split_passes


@dataclass(frozen=True)
class Run:
    """Layers first .. first+length−1, interchangeable; their kept strategies grouped into layout classes."""

    first: int
    length: int
    keep: np.ndarray  # (K_r,) global strategy ids that may be chosen (allowed, not dominated)
    cls: np.ndarray  # (K_r,) layout class of each kept strategy, 0..C_r−1
    reps: np.ndarray  # (C_r,) one kept strategy per class: the one whose R/Rp entries stand for the class

    @property
    def last(self) -> int:
        return self.first + self.length - 1

    @property
    def classes(self) -> int:
        return len(self.reps)


@dataclass(frozen=True)
class Reduced:
    """A program as the MILP sees it: runs, their per-strategy costs and per-class edge costs (all sanitised)."""

    runs: list[Run]
    A: np.ndarray  # (L, K) as in the program, zero where disallowed
    G: np.ndarray
    Ms: np.ndarray
    Ma: np.ndarray
    R: np.ndarray  # (L−1, K, K) zero where an end is disallowed
    Rp: np.ndarray
    spans: list[tuple[int, int]]  # (first, length) of the stretches of identical layers, folded or not
    W: np.ndarray | None = None  # (L, K) weight-pass seconds of a split backward, zero where disallowed

    def shared(self) -> list[tuple[tuple[int, int], list[int]]]:
        """Stretches of several identical layers with the runs that cover them: under interleaving, a device
        group runs such a stretch's layers under one strategy (`one_strategy_groups`)."""
        return [((first, length), [r for r, run in enumerate(self.runs) if first <= run.first < first + length])
                for first, length in self.spans if length > 1]

    def inner(self, r: int, table: np.ndarray) -> np.ndarray:
        """(C_r, C_r) class costs of the edges inside run r (all equal by construction)."""
        run = self.runs[r]
        return table[run.first][np.ix_(run.reps, run.reps)]

    def between(self, r: int, table: np.ndarray) -> np.ndarray:
        """(C_r, C_r+1) class costs of the edge from run r's last layer to run r+1's first."""
        left, right = self.runs[r], self.runs[r + 1]
        return table[left.last][np.ix_(left.reps, right.reps)]


def reduce_program(program: StageProgram, fold: bool) -> Reduced:
    """Runs, layout classes and dominance when `fold`; otherwise one run per layer, one class per allowed strategy."""
    ok = np.asarray(program.allowed, dtype=bool)
    A, G, Ms, Ma = (np.where(ok, np.asarray(t, dtype=float), 0.0) for t in (program.A, program.G, program.Ms,
                                                                            program.Ma))
    pair_ok = ok[:-1, :, None] & ok[1:, None, :]
    R, Rp = (np.asarray(t, dtype=float) if pair_ok.all() else np.where(pair_ok, np.asarray(t, dtype=float), 0.0)
             for t in (program.R, program.Rp))
    W = None if program.weight_gradient is None else np.where(ok, np.asarray(program.weight_gradient, dtype=float),
                                                              0.0)
    # what a strategy is judged on: with a split backward also its weight and input passes (solve.program)
    rows = (A, G, Ms, Ma) if W is None else (A, G, Ms, Ma, *split_passes(A, W)[1:])
    identical = _spans(ok, rows, (R, Rp))
    spans = identical if fold else [(u, 1) for u in range(program.layers)]
    runs = []
    for first, length in spans:
        allowed = np.flatnonzero(ok[first])
        if not fold:
            runs.append(Run(first, length, allowed, np.arange(len(allowed)), allowed))
            continue
        cls = _layout_classes(allowed, first, length, ok, R, Rp)
        keep_mask = undominated(allowed, cls, [t[first] for t in rows])
        keep, cls = allowed[keep_mask], cls[keep_mask]
        reps = np.array([keep[np.flatnonzero(cls == c)[0]] for c in range(cls.max() + 1)], dtype=int) \
            if len(keep) else np.zeros(0, dtype=int)
        runs.append(Run(first, length, keep, cls, reps))
    return Reduced(runs, A, G, Ms, Ma, R, Rp, identical, W)


def one_strategy_groups(program: StageProgram, reduced: Reduced, stage_of: np.ndarray,
                        strategies: np.ndarray) -> np.ndarray:
    """(N,) bool: which of N assignments (N, L) keep one strategy per device group on every stretch of identical
    layers (always true for plain pipelines, where the rule does not apply)."""
    ok = np.ones(strategies.shape[0], dtype=bool)
    if program.virtual_stages == 1:
        return ok
    group = program.chunk_groups[np.asarray(stage_of)]
    for (first, length), _ in reduced.shared():
        for d in np.unique(group[first:first + length]):
            held = first + np.flatnonzero(group[first:first + length] == d)
            ok &= (strategies[:, held] == strategies[:, held[:1]]).all(axis=1)
    return ok


def _spans(ok, rows, edges) -> list[tuple[int, int]]:
    """(first, length) of maximal runs: each layer equals its predecessor, each inner edge equals the run's first."""
    L = ok.shape[0]
    # like[u]: layer u equals layer u − 1; edge_like[u]: edge (u − 1, u) equals edge (u − 2, u − 1). Inside a run
    # every inner edge equals the run's first when each equals the one before it.
    like = np.ones(L, dtype=bool)
    edge_like = np.ones(L, dtype=bool)
    if L > 1:
        like[1:] = (ok[1:] == ok[:-1]).all(axis=1)
        for t in rows:
            like[1:] &= (t[1:] == t[:-1]).all(axis=1)
        for t in edges:
            edge_like[2:] &= (t[1:] == t[:-1]).reshape(L - 2, -1).all(axis=1)
    spans, first = [], 0
    for u in range(1, L):
        if not (like[u] and (u - 1 == first or edge_like[u])):
            spans.append((first, u - first))
            first = u
    spans.append((first, L - first))
    return spans


def _layout_classes(allowed, first, length, ok, R, Rp) -> np.ndarray:
    """Class id per allowed strategy: equal ids ⇔ equal R and Rp rows/columns at every edge touching the run.

    Rows and columns are compared only over the neighbours' allowed strategies (the rest are never chosen).
    """
    L = ok.shape[0]
    last = first + length - 1
    prev = np.flatnonzero(ok[first - 1]) if first > 0 else None
    nxt = np.flatnonzero(ok[last + 1]) if last + 1 < L else None
    signature: dict[bytes, int] = {}
    cls = np.empty(len(allowed), dtype=int)
    for j, k in enumerate(allowed):
        parts = []
        for t in (R, Rp):
            if prev is not None:
                parts.append(t[first - 1][prev, k])
            if nxt is not None:
                parts.append(t[last][k, nxt])
            if length > 1:
                parts += [t[first][k, allowed], t[first][allowed, k]]
        key = np.concatenate(parts).tobytes() if parts else b""
        cls[j] = signature.setdefault(key, len(signature))
    return cls


def undominated(allowed, cls, rows) -> np.ndarray:
    """Mask of strategies to keep: drop k when some k' of its class is ≤ in every row and (< in one, or equal and
    earlier), so exactly one of a set of identical strategies survives. (The relation is a strict order, so a
    strategy dropped by one that is dropped in turn is also dropped by what drops that one.)"""
    values = np.stack([row[allowed] for row in rows], axis=1)  # (n, rows)
    cls = np.asarray(cls)
    no_worse = np.all(values[:, None, :] <= values[None, :, :], axis=2)  # [i, j]: i ≤ j in every row
    # where i ≤ j everywhere, i < j somewhere unless j ≤ i everywhere too (equal): no second comparison needed
    better = ~no_worse.T
    index = np.arange(len(values))
    earlier = index[:, None] < index[None, :]
    beats = no_worse & (better | earlier) & (cls[:, None] == cls[None, :]) & (index[:, None] != index[None, :])
    return ~beats.any(axis=0)
