"""Shrink a program before it becomes a MILP: fold repeated layers, merge layouts, drop dominated strategies.

* **Runs** (TAP's folding): a maximal stretch of consecutive layers with identical rows (A, G, Ms, Ma, allowed)
  and identical edges between them (R, Rp) is one run. Its layers are interchangeable, so the MILP only needs
  how many of them each stage runs under each strategy, plus how often the layout changes between neighbours.
  Runs are found from the arrays, not from `program.group`: equal arrays are what makes folding exact, and a
  group id that promises more than the arrays hold cannot then make the MILP wrong.
* **Periodic runs** (`periodic=True`: the MILP and the partition bound of a plain or zero-bubble pipeline; the
  device-group bounds and relaxations of interleaved ones take plain runs): a stretch that repeats a pattern of
  p ≤ MAX_PERIOD layers (each layer equal to the one p before it, each edge to the edge p before it) is one run
  of p phases. The layers of one phase are interchangeable; the MILP counts them per stage and phase,
  and its transitions go from each phase to the next only. GPT-OSS alternates sliding-window and full attention,
  so no two neighbours are equal: its 36 blocks were 36 runs of one layer, and are one run of period 2.
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
from functools import cached_property

import numpy as np

from uniap.program import StageProgram
from uniap.solve.program import split_passes


MAX_PERIOD = 8
"""The longest pattern a periodic run repeats: GPT-OSS alternates two kinds of attention (2), Gemma 3 has five
local layers to one global (6). A chain with a longer period folds by its stretches of identical layers only."""


@dataclass(frozen=True)
class Run:
    """Layers first .. first+length−1 repeating a pattern of `period` layers. A layer's phase is its offset from
    `first` modulo the period; the layers of one phase are interchangeable. Their kept strategies are listed per
    phase and grouped into layout classes (each class within one phase)."""

    first: int
    length: int
    keep: np.ndarray  # (K_r,) global strategy ids that may be chosen (allowed, not dominated), phase by phase
    cls: np.ndarray  # (K_r,) layout class of each kept entry, 0..C_r−1
    reps: np.ndarray  # (C_r,) one kept strategy per class: the one whose R/Rp entries stand for the class
    phase: np.ndarray  # (K_r,) the phase of each kept entry (all 0 when the period is 1)
    period: int = 1

    @property
    def last(self) -> int:
        return self.first + self.length - 1

    @property
    def classes(self) -> int:
        return len(self.reps)

    @property
    def rows(self) -> np.ndarray:
        """(K_r,) the layer whose table rows price each kept entry: the run's first layer of its phase."""
        return self.first + self.phase

    @property
    def class_phase(self) -> np.ndarray:
        """(C_r,) the phase of each layout class."""
        phase = np.zeros(self.classes, dtype=int)
        phase[self.cls] = self.phase
        return phase

    def phase_counts(self, offset: int = 0, count: int | None = None) -> np.ndarray:
        """How many layers of each phase the run's layers offset .. offset+count−1 hold (all of them by default):
        layers j with j ≡ τ (mod period)."""
        count = self.length - offset if count is None else count
        tau = np.arange(self.period)
        return (offset + count - 1 - tau) // self.period - (offset - 1 - tau) // self.period

    def follows(self) -> np.ndarray:
        """(C_r, C_r) bool: a layer of class c' can follow one of class c inside the run (its phase is next)."""
        phase = self.class_phase
        return (phase[:, None] + 1) % self.period == phase[None, :]


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

    @cached_property
    def run_of(self) -> np.ndarray:
        """(L,) the run each layer belongs to."""
        return np.repeat(np.arange(len(self.runs)), [run.length for run in self.runs])

    def kept(self, r: int, table: np.ndarray) -> np.ndarray:
        """(K_r,) a per-layer table (A, G, Ms, Ma, W) at run r's kept entries."""
        run = self.runs[r]
        return table[run.rows, run.keep]

    def inner(self, r: int, table: np.ndarray) -> np.ndarray:
        """(C_r, C_r) class costs of the edges inside run r (equal, phase by phase, by construction); zero between
        classes that cannot follow each other (`Run.follows`)."""
        run = self.runs[r]
        phase, cost = run.class_phase, np.zeros((run.classes, run.classes))
        for tau in range(min(run.period, run.length - 1)):
            src, dst = phase == tau, phase == (tau + 1) % run.period
            cost[np.ix_(src, dst)] = table[run.first + tau][np.ix_(run.reps[src], run.reps[dst])]
        return cost

    def between(self, r: int, table: np.ndarray) -> np.ndarray:
        """(C_r, C_r+1) class costs of the edge from run r's last layer to run r+1's first."""
        left, right = self.runs[r], self.runs[r + 1]
        return table[left.last][np.ix_(left.reps, right.reps)]


def reduce_program(program: StageProgram, fold: bool, periodic: bool = False) -> Reduced:
    """Runs, layout classes and dominance when `fold` (with runs that repeat a pattern when `periodic`);
    otherwise one run per layer, one class per allowed strategy."""
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
    if not fold:
        runs = []
        for u in range(program.layers):
            allowed = np.flatnonzero(ok[u])
            runs.append(Run(u, 1, allowed, np.arange(len(allowed)), allowed, np.zeros(len(allowed), dtype=int)))
        return Reduced(runs, A, G, Ms, Ma, R, Rp, identical, W)
    pieces = _periodic_spans(ok, rows, (R, Rp)) if periodic else [(first, length, 1) for first, length in identical]
    runs = [_folded_run(first, length, period, ok, rows, R, Rp) for first, length, period in pieces]
    return Reduced(runs, A, G, Ms, Ma, R, Rp, identical, W)


def _folded_run(first: int, length: int, period: int, ok, rows, R, Rp) -> Run:
    """A run's kept strategies, phase by phase: grouped into layout classes, the dominated ones dropped (a class
    always keeps one, so its ids stay 0..n−1; each phase's are offset by the classes before it)."""
    keep, cls, phase, reps = [], [], [], []
    for tau in range(period):
        allowed = np.flatnonzero(ok[first + tau])
        classes = _layout_classes(allowed, first, length, period, tau, ok, R, Rp)
        kept = undominated(allowed, classes, [t[first + tau] for t in rows])
        ids, strategies = classes[kept], allowed[kept]
        cls.append(ids + len(reps))
        reps += [int(strategies[np.flatnonzero(ids == c)[0]]) for c in range(ids.max(initial=-1) + 1)]
        keep.append(strategies)
        phase.append(np.full(len(strategies), tau, dtype=int))
    return Run(first, length, np.concatenate(keep), np.concatenate(cls), np.array(reps, dtype=int),
               np.concatenate(phase), period)


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


def _periodic_spans(ok, rows, edges) -> list[tuple[int, int, int]]:
    """(first, length, period) of runs that repeat a pattern, left to right: from each first layer the period
    (≤ MAX_PERIOD) whose stretch reaches furthest, the shortest on a tie (identical layers repeat with every
    period, and stay period 1). A period p > 1 needs two whole repeats, or the run would fold nothing."""
    L = ok.shape[0]
    # same[p][u]: layer u equals layer u − p; same_edge[p][e]: edge (e, e + 1) equals edge (e − p, e − p + 1)
    same, same_edge = {}, {}
    for p in range(1, min(MAX_PERIOD, L - 1) + 1):
        like = np.zeros(L, dtype=bool)
        like[p:] = (ok[p:] == ok[:-p]).all(axis=1)
        for t in rows:
            like[p:] &= (t[p:] == t[:-p]).all(axis=1)
        edge_like = np.zeros(max(L - 1, 0), dtype=bool)
        if L - 1 > p:
            edge_like[p:] = np.all([(t[p:] == t[:-p]).reshape(L - 1 - p, -1).all(axis=1) for t in edges], axis=0)
        same[p], same_edge[p] = like, edge_like
    pieces, first = [], 0
    while first < L:
        best = (1, 1)
        for p in same:
            n = 1
            # layer u joins with its edge (u − 1, u): each must repeat the one p before it, once there is one
            while first + n < L and (n < p or (same[p][first + n] and (n - 1 < p or same_edge[p][first + n - 1]))):
                n += 1
            if (p == 1 or n >= 2 * p) and n > best[0]:
                best = (n, p)
        pieces.append((first, *best))
        first += best[0]
    return pieces


def _layout_classes(allowed, first, length, period, phase, ok, R, Rp) -> np.ndarray:
    """Class id per allowed strategy of one phase of a run: equal ids ⇔ equal R and Rp rows/columns at every edge
    touching the phase's layers (from the previous phase or run, to the next phase or run).

    Rows and columns are compared only over the neighbours' allowed strategies (the rest are never chosen).
    """
    L = ok.shape[0]
    last = first + length - 1
    into, out = [], []  # (edge index, the other end's allowed strategies)
    if phase == 0 and first > 0:
        into.append((first - 1, np.flatnonzero(ok[first - 1])))
    if phase > 0 or length > period:  # a layer of the previous phase precedes one of this phase inside the run
        edge = first + (phase if phase > 0 else period) - 1
        into.append((edge, np.flatnonzero(ok[edge])))
    if phase + 1 < length:
        out.append((first + phase, np.flatnonzero(ok[first + phase + 1])))
    if (length - 1) % period == phase and last + 1 < L:
        out.append((last, np.flatnonzero(ok[last + 1])))
    parts = [t[edge][np.ix_(other, allowed)].T for t in (R, Rp) for edge, other in into]
    parts += [t[edge][np.ix_(allowed, other)] for t in (R, Rp) for edge, other in out]
    signature = np.ascontiguousarray(np.concatenate(parts, axis=1)) if parts else np.zeros((len(allowed), 0))
    ids: dict[bytes, int] = {}  # equal bytes, equal class; ids in order of first appearance
    return np.array([ids.setdefault(row.tobytes(), len(ids)) for row in signature], dtype=int)


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
