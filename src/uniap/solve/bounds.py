"""Partition bounds: what integer stage contents force on the bottleneck, found by dynamic programming.

The MILP's LP relaxation spreads layers fractionally over stages, so its bottleneck is about Σ p / P even when
whole layers cannot be balanced that finely (the min-max term's LP bound is weak). Here each
stage's content is kept integral and each stage is solved exactly in isolation:

* per run, phase and stage, the Pareto front (cost, bytes) of every multiset of w layers (an exact knapsack over
  counts: integral strategy mixes under the stage's memory); a run that repeats a pattern (solve.reduce) has one
  per phase, and a stretch of it holds a number of layers of each phase fixed by where it starts and its length;
* per stage and contiguous content [u, v), the least time (Σ A) and least weighted cost (Σ A + ω G) that fit;
* a DP over contiguous partitions, for each candidate bottleneck value T in increasing order: the least
  Σ (A + ω G) + Σ min Rp over partitions whose stages all take ≤ T, a stage's time counting half of the cheapest
  send at each of its ends (the steady-state term of solve.program).

Every plan's p_i is at least its stage's least time, o ≥ the cheapest send at its boundary, R ≥ 0 and
max g ≥ Σ ω_i g_i for ω ≥ 0 with Σ ω = 1, so TPI ≥ min_T (DP(T) + (c − 1)·T) for every such ω. On real cost
tables this is within ~1e-5 of the optimum, so `solve` with a cut-off (as the UOP calls it) drops most losing
candidates without a MILP. (As rows of the MILP the same bounds made its branch and bound slower, not faster: a
global objective cut leaves the node bounds flat. They are used to prune only.)
"""

from __future__ import annotations

import math

import numpy as np

from uniap.program import StageProgram
from uniap.solve.program import MEMORY_RTOL
from uniap.solve.reduce import Reduced, reduce_program

MAX_FRONT = 4096
"""Fronts longer than this are thinned to corner points (each dominating a group): still valid, slightly weaker."""
MAX_THRESHOLDS = 256
"""Bottleneck values tried one by one; beyond them the bound uses the unconstrained DP value (still valid)."""


def front(cost: np.ndarray, weight: np.ndarray, most: int, cap: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pareto fronts of multisets of exactly w items of the given kinds, for w = 0.. up to `most` or the first w
    that does not fit: (cost, weight) arrays, weight ascending, cost strictly descending, weight ≤ cap.
    Exact up to MAX_FRONT points per front."""
    fronts = [(np.zeros(1), np.zeros(1))]
    # Only kinds no other kind beats in both cost and weight can sit on a front: a dominated one in a multiset is
    # replaced by its dominator at no loss (exact, and often 5–10× fewer kinds).
    cost, weight = _pareto(np.asarray(cost, dtype=float), np.asarray(weight, dtype=float), cap)
    for _ in range(most):
        c_prev, w_prev = fronts[-1]
        c = (c_prev[:, None] + cost[None, :]).ravel()
        w = (w_prev[:, None] + weight[None, :]).ravel()
        c, w = _pareto(c, w, cap)
        if not len(c):
            break
        fronts.append((c, w))
    return fronts


def _pareto(c: np.ndarray, w: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray]:
    keep = w <= cap
    c, w = c[keep], w[keep]
    order = np.lexsort((c, w))
    c, w = c[order], w[order]
    best = np.minimum.accumulate(c)
    mask = np.ones(len(c), dtype=bool)
    mask[1:] = c[1:] < best[:-1]
    c, w = c[mask], w[mask]
    if len(c) > MAX_FRONT:  # corner of each group: min cost (its last) at min weight (its first)
        edges = np.linspace(0, len(c), MAX_FRONT + 1).astype(int)
        c, w = c[edges[1:] - 1], w[edges[:-1]]
    return c, w


def _least(fronts: list[tuple[np.ndarray, np.ndarray]], cap: float) -> float:
    """Least total cost of one point from each front with total weight ≤ cap: the Minkowski sum (pruned) of all
    fronts but the longest, then for each of its points the longest front's cheapest point within the weight left
    (its costs fall as weights rise, so that is the last point that fits)."""
    if not fronts:
        return 0.0
    if len(fronts) == 1:  # a front holds only points that fit, costs falling as weights rise
        return float(fronts[0][0][-1]) if len(fronts[0][0]) else math.inf
    longest = max(range(len(fronts)), key=lambda i: len(fronts[i][0]))
    c, w = np.zeros(1), np.zeros(1)
    for i, (fc, fw) in enumerate(fronts):
        if i == longest:
            continue
        c, w = _pareto((c[:, None] + fc[None, :]).ravel(), (w[:, None] + fw[None, :]).ravel(), cap)
        if not len(c):
            return math.inf
    fc, fw = fronts[longest]
    last = np.searchsorted(fw, cap - w, side="right") - 1
    fit = last >= 0
    return float((c[fit] + fc[last[fit]]).min()) if fit.any() else math.inf


def partition_bound(program: StageProgram, cutoff: float | None = None) -> float:
    """A lower bound on the TPI of every plan of `program` (math.inf if no partition into P stages fits).

    ω ranges over spreading g evenly and putting it all on the first or the last stage (where embeddings and
    heads, the usual max-g stages, sit). With a `cutoff` (a TPI the caller already has) the bound is only
    computed for plans that could beat it and capped at it: a stage whose layers alone take
    p ≥ (cutoff − S)/(c − 1), S = Σ least layer times, puts TPI ≥ S + (c − 1)·p ≥ cutoff. Stage contents longer
    than that are never built, which keeps deep pipelines (few layers per stage) cheap to bound."""
    P, L, c = program.stages, program.layers, program.micro_batches
    reduced = reduce_program(program, fold=True, periodic=True)
    runs = reduced.runs
    if any(np.bincount(run.phase, minlength=run.period).min() == 0 for run in runs):
        return math.inf  # a layer with no strategy allowed
    # the least time of a layer of each phase of each run
    least_phase = [np.array([reduced.kept(r, reduced.A)[run.phase == tau].min() for tau in range(run.period)])
                   for r, run in enumerate(runs)]
    least_layer = np.array([least.min() for least in least_phase])
    depth = [min(run.length, L - P + 1) for run in runs]  # most layers of a run one stage may hold
    if cutoff is not None and c > 1:
        least_total = sum(float(least @ run.phase_counts()) for least, run in zip(least_phase, runs))
        budget = (cutoff - least_total) / (c - 1)
        if budget <= 0:
            return float(cutoff)
        depth = [d if a <= 0 else min(d, math.ceil(budget / a)) for d, a in zip(depth, least_layer)]
    def kept_at(u: int) -> np.ndarray:  # the strategies kept for layer u (those of its phase)
        run = runs[reduced.run_of[u]]
        return run.keep[run.phase == (u - run.first) % run.period]

    send = np.zeros(L)  # send[u]: cheapest send across a boundary just before layer u ≥ 1
    for u in range(1, L):
        send[u] = reduced.Rp[u - 1][np.ix_(kept_at(u - 1), kept_at(u))].min()
    inflight = np.asarray(program.inflight, dtype=float)
    tables: dict[tuple[float, float], np.ndarray] = {}

    def table(i: int, share: float) -> np.ndarray:  # stages alike in in-flight count and share share a table
        key = (float(inflight[i]), share)
        if key not in tables:
            tables[key] = _stage_table(program, reduced, key[0], share, depth)
        return tables[key]

    # The steady state prices stage [u, v) at p + (o before u + o after v)/2 (solve.program): half of each end's
    # cheapest send joins the stage's least time.
    half = np.concatenate([[0.0], send[1:], [0.0]]) / 2
    time_t = np.stack([table(i, 0.0) for i in range(P)]) + half[:, None] + half[None, :]
    candidates = np.unique(time_t[np.isfinite(time_t)])
    bottleneck = least_bottleneck(time_t, candidates)
    if bottleneck == math.inf:  # with a cutoff: or no stage contents short enough to beat it
        return math.inf if cutoff is None else float(cutoff)
    best = -math.inf
    for omega in (np.full(P, 1.0 / P), np.eye(P)[0], np.eye(P)[P - 1]):
        cost_t = np.stack([table(i, float(omega[i])) for i in range(P)])
        best = max(best, _best(cost_t, time_t, send, candidates[candidates >= bottleneck], c))
    return best if cutoff is None else min(best, float(cutoff))


def _stage_table(program: StageProgram, reduced: Reduced, infl: float, share: float,
                 depth: list[int]) -> np.ndarray:
    """(L+1, L+1): least Σ (A + share·G) of content [u, v) on a stage holding `infl` micro-batches, under its
    memory (inf: does not fit, or holds more than depth[r] layers of some run r)."""
    L = program.layers
    runs = reduced.runs
    cap = float(program.memory_capacity) * (1 + MEMORY_RTOL)
    fronts = []  # fronts[r][τ]: run r's phase τ, its fronts by count
    for r, (run, most) in enumerate(zip(runs, depth)):
        cost = reduced.kept(r, reduced.A) + share * reduced.kept(r, reduced.G)
        weight = reduced.kept(r, reduced.Ms) + infl * reduced.kept(r, reduced.Ma)
        if cap == math.inf:
            weight = np.zeros_like(weight)  # memory never binds: each front collapses to its cheapest point
        fronts.append([front(cost[run.phase == tau], weight[run.phase == tau], most, cap)
                       for tau in range(run.period)])

    def piece(r: int, offset: int, count: int) -> list | None:
        """The fronts of `count` layers of run r from its layer `offset` on (one per phase they hold), or None
        where some phase has more than fit."""
        counts = runs[r].phase_counts(offset, count)
        if any(n >= len(f) for n, f in zip(counts, fronts[r])):
            return None
        return [f[n] for n, f in zip(counts, fronts[r]) if n > 0]

    out = np.full((L + 1, L + 1), math.inf)
    for r, run in enumerate(runs):  # contents inside one run: where they start in its pattern and their count
        for start in range(min(run.period, run.length)):
            least = np.full(run.length + 1, math.inf)
            if run.period == 1:  # one front: its cheapest point by count
                least[:len(fronts[r][0])] = [costs[-1] for costs, _ in fronts[r][0]]
            else:
                for count in range(1, run.length + 1):
                    held = piece(r, start, count)
                    if held is None or (value := _least(held, cap)) == math.inf:
                        break
                    least[count] = value
            u, v = np.meshgrid(np.arange(run.first + start, run.last + 1, run.period),
                               np.arange(run.first + 1, run.last + 2), indexing="ij")
            inside = v > u
            out[u[inside], v[inside]] = least[(v - u)[inside]]
    for r_a in range(len(runs)):  # contents spanning runs r_a .. r_b: partial ends, whole runs between
        for r_b in range(r_a + 1, len(runs)):
            middle = [piece(r, 0, runs[r].length) for r in range(r_a + 1, r_b)]
            if any(whole is None for whole in middle):
                break  # a whole run in between does not fit: nor does anything longer
            middle = [f for whole in middle for f in whole]
            fitted = False
            for u in range(runs[r_a].first, runs[r_a].last + 1):
                head = piece(r_a, u - runs[r_a].first, runs[r_a].last + 1 - u)
                if head is None:
                    continue
                for v in range(runs[r_b].first + 1, runs[r_b].last + 2):
                    tail = piece(r_b, 0, v - runs[r_b].first)
                    if tail is None:
                        break
                    value = _least([*head, *middle, *tail], cap)
                    if value == math.inf:
                        break
                    out[u, v] = value
                    fitted = True
            if not fitted:
                break
    return out


def _reach(time_t: np.ndarray, T: float) -> bool:
    """Can P contiguous non-empty stages, each of least time ≤ T, cover the chain?"""
    P, n = time_t.shape[0], time_t.shape[1]
    ok = np.zeros(n, dtype=bool)
    ok[0] = True
    for i in range(P):
        ok = np.any(ok[:, None] & (time_t[i] <= T), axis=0)
    return bool(ok[-1])


def least_bottleneck(time_t: np.ndarray, candidates: np.ndarray) -> float:
    """The least of the ascending `candidates` T for which P contiguous non-empty stages, stage i's content [u, v)
    taking time_t[i, u, v], each ≤ T, cover the chain (inf: none does)."""
    lo, hi = 0, len(candidates) - 1
    if hi < 0 or not _reach(time_t, candidates[hi]):
        return math.inf
    while lo < hi:
        mid = (lo + hi) // 2
        if _reach(time_t, candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo])


def _best(cost_t, time_t, send, candidates, c) -> float:
    """min over thresholds T (ascending `candidates`) of (c − 1)·T + the least Σ cost + Σ send over partitions
    whose stages all take ≤ T. The DP value only falls as T grows, so once (c − 1)·T plus the unconstrained DP
    value reaches the best found, no larger T can do better."""
    P, n = cost_t.shape[0], cost_t.shape[1]
    start = np.concatenate([[0.0], send[1:], [math.inf]])  # boundary cost of a stage beginning at u ≥ 1

    def dp(T):
        F = np.full(n, math.inf)
        F[0] = 0.0
        for i in range(P):
            step = np.where(time_t[i] <= T, cost_t[i], math.inf)
            F = np.min((F + (start if i > 0 else 0.0))[:, None] + step, axis=0)
        return F[-1]

    floor = dp(math.inf)
    best = math.inf
    for k, T in enumerate(candidates):
        if (c - 1) * T + floor >= best:
            break
        if k == MAX_THRESHOLDS:  # every larger T gives at least (c − 1)·T + floor
            return float(min(best, (c - 1) * T + floor))
        best = min(best, (c - 1) * T + dp(T))
    return float(best)

