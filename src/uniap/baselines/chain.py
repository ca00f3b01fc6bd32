"""Per-layer dynamic program over strategies on a chain of layers, under a memory budget.

Galvatron's search (Miao et al., VLDB 2023, §4: "dynamic programming ... with a memory budget") and our stand-in
for Alpa's intra-operator ILP (Zheng et al., OSDI 2022, §4; on a chain an ILP with resharding edges is solved
exactly by this DP) both reduce to: choose a strategy k_u for each layer u of a contiguous range to minimise

    Σ_u cost[u, k_u] + Σ_u trans[u, k_u, k_(u+1)]     subject to     Σ_u mem[u, k_u] ≤ capacity.

Memory is discretised into `bins` steps of capacity / bins, each layer's memory rounded *up*, so whatever the DP
returns really fits (it may miss a plan that fits by less than one step per layer). State: (strategy of the last
layer, memory used ≤ m); transitions are grouped by *layout class* — strategies with equal rows and columns of the
transition table (in the real cost model: same dp/tp/sp layout, whatever ZeRO stage or recomputation) — which is
exact and makes a step cost O(C² + K) per memory level instead of O(K²).
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_BINS = 1024


def layout_classes(trans: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(class of each strategy, one representative per class): equal class ⇔ equal rows and columns of every
    transition table slice."""
    trans = np.asarray(trans, dtype=float).reshape(-1, K, K)
    signature: dict[bytes, int] = {}
    cls = np.empty(K, dtype=int)
    reps = []
    for k in range(K):
        key = np.concatenate([trans[:, k, :].ravel(), trans[:, :, k].ravel()]).tobytes()
        if key not in signature:
            signature[key] = len(signature)
            reps.append(k)
        cls[k] = signature[key]
    return cls, np.array(reps, dtype=int)


def memory_bins(mem: np.ndarray, capacity: float, bins: int) -> np.ndarray:
    """Memory of each (layer, strategy) in steps of capacity / bins, rounded up; bins + 1 where it cannot fit."""
    if not math.isfinite(capacity):
        return np.zeros(np.shape(mem), dtype=int)
    step = capacity / bins
    with np.errstate(invalid="ignore", over="ignore"):
        w = np.ceil(np.asarray(mem, dtype=float) / step - 1e-9)
    w = np.where(np.isfinite(w), w, bins + 1)
    return np.clip(w, 0, bins + 1).astype(int)


class ChainDP:
    """The DP over one chain (a program's layers), for one memory budget; `best` (one range, with the assignment)
    and `range_costs` (every range at once, costs only).

    Before the DP, a strategy is dropped at a layer when another of its layout class is no worse there in both
    objective and (binned) memory — exact, since both then pay the same transitions — and strategies dropped at
    every layer leave the problem, which shrinks K several-fold on real tables (ZeRO stages of one layout often
    dominate each other).
    """

    def __init__(self, cost: np.ndarray, trans: np.ndarray, mem: np.ndarray, capacity: float,
                 bins: int = DEFAULT_BINS):
        cost = np.asarray(cost, dtype=float)  # (L, K), inf where not allowed
        trans = np.asarray(trans, dtype=float)  # (L-1, K, K)
        trans = np.where(np.isnan(trans), math.inf, trans)
        self.L, K = cost.shape
        self.bins = bins
        w = memory_bins(mem, capacity, bins)
        cost = np.where((w > bins) | np.isnan(cost), math.inf, cost)
        cls, _ = layout_classes(np.where(np.isfinite(trans), trans, 0.0), K)
        cost = np.where(_dominated(cost, w, cls), math.inf, cost)
        # Keep the strategies still usable somewhere, ordered by class so each class is a contiguous slice.
        kept = [k for k in np.argsort(cls, kind="stable") if np.isfinite(cost[:, k]).any()]
        self.kept = np.array(kept, dtype=int)  # compressed index → caller's strategy index
        self.K = len(kept)
        self.cost = cost[:, self.kept] if self.K else np.zeros((self.L, 0))
        self.w = w[:, self.kept] if self.K else np.zeros((self.L, 0), dtype=int)
        kept_cls = cls[self.kept]
        _, self.starts, self.cls = np.unique(kept_cls, return_index=True, return_inverse=True)
        self.C = len(self.starts)
        reps = self.kept[self.starts]  # one member per class: all members share its transition rows/columns
        self.Rc = trans[:, reps][:, :, reps] if self.L > 1 else np.zeros((0, self.C, self.C))
        self.members = [np.arange(a, b) for a, b in zip(self.starts, list(self.starts[1:]) + [self.K])]

    def _first(self, u: int) -> np.ndarray:
        """(K, M+1) values of a range starting at layer u."""
        m = np.arange(self.bins + 1)
        return np.where(m[None, :] >= self.w[u][:, None], self.cost[u][:, None], math.inf)

    def _classes_min(self, V: np.ndarray) -> np.ndarray:
        """(..., C, M+1): the best strategy of each class."""
        B = np.empty(V.shape[:-2] + (self.C, V.shape[-1]))
        for c, members in enumerate(self.members):  # contiguous slices: far faster than ufunc.reduceat here
            np.min(V[..., members[0]:members[-1] + 1, :], axis=-2, out=B[..., c, :])
        return B

    def _into(self, B: np.ndarray, u: int) -> np.ndarray:
        """T[..., c, m] = min_c' B[..., c', m] + Rc[u−1][c', c]."""
        Rc = self.Rc[u - 1]
        T = np.empty_like(B)
        for c in range(self.C):
            np.min(B + Rc[:, c][:, None], axis=-2, out=T[..., c, :])
        return T

    def _gather(self, T: np.ndarray, u: int) -> np.ndarray:
        """new[..., k, m] = T[..., cls k, m − w[u, k]] + cost[u, k] (inf where m < w)."""
        M1 = self.bins + 1
        m = np.arange(M1)
        shift = m[None, :] - self.w[u][:, None]  # (K, M+1)
        flat = self.cls[:, None] * M1 + np.maximum(shift, 0)
        new = T.reshape(T.shape[:-2] + (self.C * M1,))[..., flat]
        new += self.cost[u][:, None]
        new[..., shift < 0] = math.inf
        return new

    def best(self, first: int, last: int) -> tuple[float, np.ndarray | None]:
        """Minimum objective of layers first..last and the (caller's) strategy of each (None if nothing fits)."""
        if self.K == 0:
            return math.inf, None
        M = self.bins
        V = self._first(first)
        backs = []
        for u in range(first + 1, last + 1):
            B = self._classes_min(V)
            argB = np.stack([mem[V[mem].argmin(axis=0)] for mem in self.members])  # (C, M+1) strategy
            full = B[:, None, :] + self.Rc[u - 1][:, :, None]  # (C', C, M+1)
            argT = full.argmin(axis=0)  # (C, M+1) previous class
            T = full.min(axis=0)
            V = self._gather(T, u)
            shift = np.arange(M + 1)[None, :] - self.w[u][:, None]
            j = np.maximum(shift, 0)
            backs.append(argB[argT[self.cls[:, None], j], j])  # previous strategy of (k, m)
        k = int(np.argmin(V[:, M]))
        value = float(V[k, M])
        if not math.isfinite(value):
            return math.inf, None
        out = np.empty(last - first + 1, dtype=int)
        m = M
        for i in range(last - first, -1, -1):
            out[i] = k
            if i == 0:
                break
            prev_k = int(backs[i - 1][k, m])
            m -= int(self.w[first + i, k])
            k = prev_k
        return value, self.kept[out]

    def range_costs(self, first_min: int = 0, first_max: int | None = None, last_max: int | None = None
                    ) -> np.ndarray:
        """(L, L) array: [a, b] = minimum objective of layers a..b (inf if b < a or nothing fits), for every
        start first_min ≤ a ≤ first_max and end b ≤ last_max (defaults: all), vectorised over the starts."""
        L, M = self.L, self.bins
        out = np.full((L, L), math.inf)
        if self.K == 0:
            return out
        first_max = L - 1 if first_max is None else min(first_max, L - 1)
        last_max = L - 1 if last_max is None else min(last_max, L - 1)
        V = np.full((0, self.K, M + 1), math.inf)
        for u in range(first_min, last_max + 1):
            if len(V):
                V = self._gather(self._into(self._classes_min(V), u), u)
            if u <= first_max:
                V = np.concatenate([V, self._first(u)[None]], axis=0)
            out[first_min:first_min + len(V), u] = V[:, :, M].min(axis=1)
        return out


def _dominated(cost: np.ndarray, w: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """(L, K) mask: strategy k at layer u is matched by another of its class, no worse in objective and memory
    (better in one, or equal and listed first)."""
    same = cls[:, None] == cls[None, :]  # (k', k)
    order = np.arange(len(cls))
    earlier = order[:, None] < order[None, :]
    c1, c2 = cost[:, :, None], cost[:, None, :]  # (L, k', 1), (L, 1, k)
    w1, w2 = w[:, :, None], w[:, None, :]
    with np.errstate(invalid="ignore"):
        no_worse = (c1 <= c2) & (w1 <= w2) & np.isfinite(c1)
        better = (c1 < c2) | (w1 < w2) | earlier[None]
    return (no_worse & better & same[None] & ~np.eye(len(cls), dtype=bool)[None]).any(axis=1)
