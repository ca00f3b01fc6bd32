"""A lower bound on an interleaved or zero-bubble program by dynamic programming over its device groups, in
hundredths of a second.

Under interleaving each device group runs its blocks under one strategy (solve.reduce), so for the usual chain
(an embedding, a run of identical blocks, a head) a group is described by its strategy s, its block count n and,
for the first and last group, the strategy of the embedding or head. For a fixed slot B the TPI of
solve.program is then bounded group by group:

    Σ_d b_d + c·Σ_{j∈d} (p_j − b_d)⁺  ≥  b + c·max(E_d(b), M_d − b, a_d − v·b),   b = min(B, M_d)

with a_d ≤ the group's time (Σ of its layers' A), M_d ≤ its largest chunk (whole blocks: at least ⌈n/v⌉ of
them, or the embedding's chunk with what the other v − 1 chunks cannot hold, and at least a_d / v; memory may
force more) and E_d(b) = Σ_k (l_k − b)⁺ over the chunks l_k of the most even cut of its blocks (`_most_even`):
every cut has at least that excess, whatever b (13 blocks in 6 chunks over a slot of 2.2 blocks: 1.6 blocks,
where a − v·b sees 0.2). Why: b_d lies in [min(B, largest chunk), B], the left side falls as b_d rises to the
largest chunk, and the right side rises with M_d. The gradient sync enters as ω·g (max g ≥ Σ ω_d g_d, ω uniform
or on one end), and without a cut-off also as max g itself (`_capped_sync`: with H the largest sync, every
group's g ≤ H, searched over H as over B); the sends as the P·v − 1 cheapest edges, resharding as 0. The block
counts must add up: a min-plus convolution over the groups. On Nemotron-4 340B fp8 on 128 H100 (96 blocks, pp8)
the bound of the pp8·v6 candidate is its optimum, 3.499 s (the weighted sync and the slot-wide excess put it at
3.452 s), and that of pp8·v7 is 3.506 s, above it (3.495 s), so the search proves the optimum without v7's MILP.

A split backward (zero bubble, ZBV, DualPipeV) is bounded the same way. Its TPI (solve.program.
split_backward_tpi) is at least c times its v longest chunks X = min over B of v·B + Σ_j (p_j − B)⁺ (a chunk's
excess over B = F̂ + Î + Ŵ is at most the sum of its passes' excesses over their levels), with no b_d of each
group's own, plus its bubble, each group's share of it read from its own forward and input passes
(`_pricing`), κ times the largest send (at least the (S − 1)-th least edge) and the sync. Under a V the first
group holds both ends: the head is priced at its least time, sync, bytes and input pass, with no place in the
cut. On llama2-70b's ZBV pp8 c = 128 candidate it
gives 79.89 s against an optimum of 79.94 s, where the bound by contents (solve.split_bound), which charges a
group its work but not how it falls into chunks, gives 78.05 s: there memory rewards putting the first group's
blocks in its second chunk, which holds one micro-batch.

As a function of B each group's bound is piecewise linear with breakpoints at M_d, at the most even cut's chunk
times and where its three terms meet (`_breakpoints`), so between breakpoints the DP's value is a minimum of linear functions (concave)
and (c·v − 1)·B + DP(B) is least at a breakpoint, which `_least_over_slots` finds without trying them all.
Memory: each group's bytes at the least micro-batches its chunks hold (at one moment of the schedule), every
strategy with its own bytes. The bound is about as strong as the device-group MILP without edge counts
(group_relaxation.py; within 0.1 % on real tables) and, with the incumbent as cut-off (counts whose time alone
reaches it are dropped), 4–50× cheaper: 0.01–0.05 s on llama2-70b and GPT 1T candidates, so the UOP drops most
losing interleaved candidates without a MILP.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from uniap.program import StageProgram
from uniap.schedules import FORWARD_SHARE
from uniap.solve.program import MEMORY_RTOL, bubble_terms, least_largest_send, least_sends, split_send_hops
from uniap.solve.one_block import one_block_relaxation, one_kind_of_block
from uniap.solve.reduce import Reduced, reduce_program, undominated

PROBES = 24
"""Slot values at which the DP runs per round of refinement (each a min-plus convolution per group)."""
SYNC_GAIN = 1 + 1e-3
"""The sync is searched as max_d g_d (`_capped_sync`) only where that can raise the bound by more than this
factor: llama2-70b's pp8·v4 candidate gains 0.003 % for 1 s; Nemotron-4 340B's pp8·v6 on 128 H100 gains 0.3 %,
which proves its optimum."""
SYNC_STEPS = 4
"""Searches over the slots `_capped_sync` may run, each under a lower cap on the largest sync."""


def group_bound(program: StageProgram, reduced: Reduced | Callable[[], Reduced], cutoff: float | None = None,
                contents: bool = False):
    """A lower bound on the TPI of every plan of the interleaved or zero-bubble `program`, math.inf if none fits.
    It reads a chain of an embedding, one run of identical blocks and a head (`reduced`: the program's folded
    runs, or a function that gives them); a chain with blocks of several kinds is bounded on its one-block
    relaxation (solve.one_block), whose contents are not the program's (counts None), and its own runs are then
    not needed (GPT-OSS 120B's take 0.1-0.3 s to fold, where most candidates are cut off by this bound); None
    for a program of one chunk per group.

    The breakpoints are searched by interval: DP(B) never rises with B, so on [B_i, B_j] the bound is at least
    slope·B_i + DP(B_j) (`Pricing`); intervals that cannot go below the best value found (or the `cutoff`) are dropped,
    the others probed again. With a `cutoff`, returns as soon as some slot value shows the bound is below it
    (what it returns is then still a valid bound, below the cutoff).

    `contents` (interleaved 1F1B, without a cutoff): returns (bound, counts), counts the group contents where the bound is
    attained (per run, (P, K_r) layers over the run's kept strategies, as GroupRelaxation.contents), or None: a
    plan holding them (group_relaxation.chain_plan) that reaches the bound is optimal with no MILP at all. The
    bound prices no resharding, so where an end layer of them reshards from its group's blocks a plan reaches it
    only with that layer alone in its chunk; the best plan built from them is still an incumbent for the search
    (with them, Nemotron-4 340B fp8 on 128 H100 holds 3.499 s after 120 s, where it held 3.606 s)."""
    P, v = program.pipeline_degree, program.virtual_stages
    if v < 2:
        return None
    split = program.split_schedule is not None
    pricing = _pricing(program)
    one_kind = one_kind_of_block(program)
    if one_kind:
        reduced = reduced() if callable(reduced) else reduced
        runs = reduced.runs
    if not one_kind or len(runs) != 3 or runs[0].length != 1 or runs[2].length != 1:
        relaxed = one_block_relaxation(program)
        if relaxed is None:
            return None
        bound = group_bound(relaxed, reduce_program(relaxed, fold=True), cutoff)
        return (bound, None) if contents else bound
    blocks = runs[1].length
    kept = [_kept(reduced, run) for run in runs]
    ends = program.chunk_groups[[0, program.stages - 1]]  # the groups of the embedding's and the head's chunks
    kind_of = ["both" if d == ends[0] == ends[1] else "first" if d == ends[0] else "last" if d == ends[1]
               else "middle" for d in range(P)]
    kinds = {kind: _group_terms(program, kept, kind, blocks, pricing) for kind in set(kind_of)}
    sends = pricing.sends
    groups = []  # per group: ((its kind, its profile), a, M, g, what fits it, F, its bubble share), each
    #              (choices, blocks + 1)
    choices = []  # per group: the indices of its kept choices among its kind's
    kept_of: dict[tuple, tuple] = {}  # groups of one kind whose M and counts that fit agree keep the same
    for d, kind in enumerate(kind_of):
        got = _group_choices(program, d, kind, kinds[kind], pricing, cutoff, kept_of)
        if not isinstance(got, tuple):  # no count fits its memory (inf), or none can beat the cut-off (capped there)
            return (got, None) if contents else got
        groups.append(got[0])
        choices.append(got[1])
    windows = [_window(*group[1:]) for group in groups]
    slots = np.unique(np.concatenate([[0.0]] + [_breakpoints(v, *group[1:], whole=cutoff is None)
                                                for group in groups]))
    slope = pricing.slope(v)

    def value(B, w, cap=math.inf):
        costs, alike = [], {}
        for x, (profile, *_), window in zip(w, groups, windows):
            key = (profile, float(x))  # groups of one profile (kind, M, what fits) cost the same
            if key not in alike:
                alike[key] = _slot_cost(B, v, x, pricing, *_capped(window, cap))
            costs.append(alike[key])
        return slope * B + _chain_dp(costs, blocks) + sends

    best, best_at = -math.inf, None
    # The sync weighted on the first group or on the last gave every exact bound of the GPT-1T search, the
    # uniform one none: those first, and a weighting that cannot beat the best so far stops at its first probe
    # below it.
    for omega in (np.eye(P)[0], np.eye(P)[P - 1], np.full(P, 1.0 / P)):
        least, slot = _least_over_slots(slots, partial(value, w=omega), slope,
                                        None if cutoff is None else max(cutoff, best), best,
                                        None if best_at is None else best_at[1])
        if least > best:
            best, best_at = least, (omega, slot, math.inf)
        if cutoff is not None and best >= cutoff:
            break
    if cutoff is None and best_at is not None and best_at[1] is not None and \
            _sync_spread(windows, v, pricing, blocks, *best_at) > best * (SYNC_GAIN - 1):
        least, at = _capped_sync(slots, value, slope, windows, P, v, pricing, blocks, best)
        if least > best:
            best, best_at = least, at
    if contents:
        at = None if cutoff is not None or best_at is None or best_at[1] is None or split else \
            _contents(program, reduced, kept, groups, choices, windows, blocks, pricing, *best_at)
        return best, at
    return best if cutoff is None else min(best, float(cutoff))


def _group_choices(program: StageProgram, d: int, kind: str, terms: tuple, pricing: Pricing, cutoff: float | None,
                   kept_of: dict) -> tuple | float:
    """Group d's entry of `group_bound`: (((kind, profile), a, M, g, what fits, levels, counts, bubble share) over
    its kept choices, their indices among its kind's), or the bound itself when no count fits the group's memory
    (inf) or none can beat the cut-off (the cut-off). `kept_of` (shared by the groups of one call) keeps one set of
    choices per kind, M and counts that fit."""
    capacity = float(program.memory_capacity) * (1 + MEMORY_RTOL)
    sends = pricing.sends
    a, time_bound, g, levels, counts, extra, largest, rates, byte_rates = terms
    M = largest(program.group_inflight[d], capacity)  # inf where the group's bytes fit no cut into chunks
    fits = np.isfinite(M)
    if cutoff is not None:
        # Whatever B, the slope times B plus the group's term ≥ rate·a + its bubble share (B < M:
        # own·B + rate·(a − v·B) + …; else rate·v·M + … ≥ rate·a + …; c·a under interleaved 1F1B): a count
        # whose time alone reaches the cut-off is dropped, and the bound is then capped at it.
        fits = fits & (pricing.rate * a + extra + sends < cutoff)
    key = (kind, fits.tobytes(), M.tobytes())
    if key not in kept_of:
        # A choice that another beats in every rate its a and g grow with, and in the most count that fits,
        # is never needed: M grows with those rates too, and where memory forces it higher it grows with the
        # bytes as well (with a lighter, faster choice, every largest chunk that fits the other's bytes fits
        # its own), so there the bytes must be beaten too.
        most = np.where(fits.any(axis=1), fits.shape[1] - np.argmax(fits[:, ::-1], axis=1), -1)
        forced = not np.array_equal(M[fits], time_bound[fits])
        keep = undominated(np.arange(len(M)), np.zeros(len(M), dtype=int),
                           [*rates, *(byte_rates if forced else ()), -most]) if fits.any() else fits.any(axis=1)
        verdict = None if fits.any() else math.inf if not np.isfinite(M).any() else float(cutoff)
        kept_of[key] = (len(kept_of), keep, M[keep], fits[keep], verdict)
    profile, keep, M, fits, verdict = kept_of[key]
    if verdict is not None:
        return verdict
    # Every cut has at least the most even cut's excess over a slot, and at least its largest chunk's
    # (`_slot_values`): M, or the most even cut's largest where that is more (no cut's is less).
    levels_kept, counts_kept = levels[:, keep], counts[:, keep]
    even_largest = np.where(counts_kept > 0, levels_kept, 0.0).max(axis=0)
    if cutoff is not None:
        # Pruning against a cut-off prices the largest chunks alone, F of them at the most even cut's
        # largest where memory forces no more (else the forced one): a third of the work per slot, and
        # most candidates it meets are far from the cut-off. The exact bound prices the whole cut.
        top = levels_kept >= even_largest[None] * (1 - 1e-12)
        full = np.where(M > even_largest * (1 + 1e-9), 1.0, (counts_kept * top).sum(axis=0))
        none = np.zeros_like(full)
        levels_kept = np.stack([np.maximum(M, even_largest), none, none])
        counts_kept = np.stack([full, none, none])
    return ((kind, profile), a[keep], np.maximum(M, even_largest), g[keep], fits, levels_kept, counts_kept,
            extra[keep]), np.flatnonzero(keep)


def _sync_spread(windows, v: int, pricing: Pricing, blocks: int, omega: np.ndarray, B: float, cap: float) -> float:
    """How much more than the weights ω charged the contents where the bound is least pay for their largest
    sync: where that is nothing much, pricing the largest sync as itself (`_capped_sync`) is not tried."""
    picks = _least_picks(windows, v, pricing, omega, B, cap, blocks)
    if picks is None:
        return 0.0
    syncs = np.array([window[3][pick] for window, pick in zip(windows, picks)])
    return float(syncs.max() - omega @ syncs)


def _capped(window: tuple, cap: float) -> tuple:
    """A group's `_window` (less its rows) with the counts whose sync g exceeds `cap` priced at inf."""
    lo, a, M, g, penalty, levels, counts = window[:7]
    if cap < math.inf:
        penalty = np.where(g <= cap, penalty, math.inf)
    return lo, a, M, g, penalty, levels, counts


def _capped_sync(slots: np.ndarray, value, slope: float, windows, P: int, v: int, pricing: Pricing, blocks: int,
                 known: float) -> tuple[float, tuple | None]:
    """The bound with the sync priced as max_d g_d itself, where the weights ω price Σ_d ω_d·g_d: a plan whose
    largest group sync is H has every group's g ≤ H, so its TPI is at least H + D(H), D(H) the bound without sync
    over the counts whose g ≤ H, which never rises with H. With uneven group sizes (Nemotron-4 340B on 128 H100,
    pp8·v6: 12 or 13 blocks) the weighted sum sees the mean sync, 0.141 s, where the plan pays 0.152 s.

    Searched downwards from H = ∞: where D(H) is least its contents' largest sync is G, so every H in [G, H]
    costs at least G + D(H); the next H is the largest sync below G, and below the last one tried every H costs
    at least the least sync plus its D. At most SYNC_STEPS searches over slots, each ending early where nothing
    lower can improve the bound. Returns (bound, where it is attained: (ω = 0, slot, H)), or (known, None) where
    it adds nothing."""
    none = np.zeros(P)
    syncs = np.unique(np.concatenate([window[3][np.isfinite(window[4])] for window in windows]))
    if not len(syncs):
        return known, None
    cap, least, at = math.inf, math.inf, None
    for _ in range(SYNC_STEPS):
        cost, slot = _least_over_slots(slots, partial(value, w=none, cap=cap), slope, None)
        if slot is None or not math.isfinite(cost):
            break
        picks = _least_picks(windows, v, pricing, none, slot, cap, blocks)
        top = max(window[3][pick] for window, pick in zip(windows, picks))
        if top + cost < least:
            least, at = top + cost, (none, slot, cap)
        below = syncs[syncs < top * (1 - 1e-12)]
        if not len(below):
            cost = math.inf  # no sync lies below: nothing is left to floor
            break
        if syncs[0] + cost >= least or (cap == math.inf and least <= known * SYNC_GAIN):
            break  # nothing below adds, or (at the first step) the weights' bound is as good
        cap = float(below[-1])
    least = min(least, syncs[0] + cost)  # every sync below the last cap tried costs at least the least one + D
    return (least, at) if least > known else (known, None)


def _least_over_slots(slots: np.ndarray, value, slope: float, cutoff: float | None,
                      beat: float = -math.inf, near: float | None = None) -> tuple[float, float | None]:
    """A lower bound on min over the sorted `slots` of value(B) = slope·B + D(B), D non-increasing, and the slot
    that attains it (None where it is an interval's floor): exact unless it is below `cutoff` (then the search
    stops at the first probe below it) or at least `cutoff` (then it is the cutoff). On [slots[i], slots[j]]
    between two probes, value ≥ slope·slots[i + 1] + D(slots[j]); an interval whose bound reaches the best probe
    or the cutoff holds nothing lower that matters, the others are probed again. `beat`: a bound the caller
    already has; the search stops at the first probe below it (what it returns is then below it), and is
    otherwise exact. `near`: the slot where that bound was attained, probed first with the ends (the value at it
    is most often already below `beat`)."""
    first = [0, len(slots) - 1]
    if near is not None:
        first.append(int(np.searchsorted(slots, near)))
    first = sorted({min(i, len(slots) - 1) for i in first})
    known = dict(zip(first, map(float, value(slots[first]))))
    while True:
        best = min(known.values())
        probed = sorted(known)
        floors = {(i, j): slope * (slots[i + 1] - slots[j]) + known[j]
                  for i, j in zip(probed[:-1], probed[1:]) if j > i + 1}
        open_ = [key for key, floor in floors.items() if floor < (best if cutoff is None else min(best, cutoff))]
        if not open_ or (cutoff is not None and best < cutoff) or best < beat:
            least = min([best] + [floors[key] for key in open_])
            if cutoff is not None and least >= cutoff:
                return float(cutoff), None  # intervals above the cutoff were left unprobed
            return least, (float(slots[min(known, key=known.get)]) if least == best else None)
        share = max(2, PROBES // len(open_))
        picks = sorted({int(k) for i, j in open_ for k in np.linspace(i + 1, j - 1, min(j - i - 1, share))})
        for k, x in zip(picks, value(slots[picks])):
            known[k] = float(x)


def _group_terms(program: StageProgram, kept: list[tuple[np.ndarray, ...]], kind: str, blocks: int,
                 pricing: Pricing):
    """The choices of a group of `kind` (first, middle, last, or both: the embedding's and the head's, as under
    a V): its block strategy, and on the first and last group its end layer's strategy, against its block count
    n = 0..blocks: (a, M, g), each (choices, blocks + 1),
    the chunk times of the most even cut and how many chunks take each ((3, choices, blocks + 1) twice: `_most_even`),
    and memory(held), its least bytes given the micro-batches each of its chunks holds (inf where n is too few
    to give every chunk a layer), and per choice the rates a, M and g grow with (block and end layer times and
    syncs). `kept`: (A, G, Ms, Ma) of the embedding's, the blocks' and the head's
    undominated strategies.

    Both ends (the embedding in its first chunk, the head in its last): the embedding is priced as on the first
    group, and the head at its least time, sync and bytes with no place in the cut, which only lowers the
    largest chunk and the bytes (its chunk, like the embedding's, may hold no block)."""
    v = program.virtual_stages
    n = np.arange(blocks + 1, dtype=float)
    t, gk, ms, ma, it, _ = kept[1]
    head = (0.0,) * 5  # (time, sync, static and activation bytes, input pass) beside the end layer, on "both"
    empty = ()  # chunks that may hold no block
    if kind == "middle":
        x = xg = xm = xa = xi = np.zeros(1)
        end_chunk = None
    else:
        x, xg, xm, xa, xi, _ = kept[2] if kind == "last" else kept[0]
        end_chunk = v - 1 if kind == "last" else 0  # the end layer's chunk may hold no block
        if kind == "both":
            head, empty = tuple(float(table.min()) for table in kept[2][:5]), (v - 1,)
    at_least = v - (end_chunk is not None) - len(empty)  # chunks that hold a block
    shape = (len(t), len(x), len(n))  # (block strategy, end strategy, n)
    levels, counts = _most_even(t, x if end_chunk is not None else None, blocks, v)
    a = t[:, None, None] * n + x[None, :, None] + head[0]
    g = gk[:, None, None] * n + xg[None, :, None] + head[1]
    extra = pricing.forward * a + pricing.input * (it[:, None, None] * n + xi[None, :, None] + head[4])
    if end_chunk is None:
        largest = np.broadcast_to(np.ceil(n / v) * t[:, None, None], shape)
    else:
        largest = _end_group_largest(t, x, n, v)
    largest = np.maximum(largest, a / v)

    # Per (block strategy, end strategy, n), flat, for `largest_fitting` (the same for every group of the kind).
    T, X, N, Xa, M = (np.broadcast_to(arr, shape).ravel() for arr in (t[:, None, None], x[None, :, None], n,
                                                                      xa[None, :, None], largest))
    Ma = np.broadcast_to(ma[:, None, None], shape).ravel()
    static = (ms[:, None, None] * n + xm[None, :, None] + head[2]).ravel()
    timed = T > 0  # blocks that take no time are capped by nothing
    step = np.where(timed, T, 1.0)
    spare = np.where(timed, np.ceil(X / step - 1e-9), 0.0)  # blocks' worth of the end layer's time
    every = np.arange(len(T))
    top = N + spare + 1.0  # caps that hold every block: the least bytes of any cut
    within = np.floor(M / step * (1 + 1e-12))  # the most blocks a chunk holds within the time bound

    def largest_fitting(held: np.ndarray, capacity: float) -> np.ndarray:
        # The largest chunk, at least the time bound above and at least what memory forces at the moment `held`
        # (micro-batches per chunk position; `program.held` lists 50–60 such moments per group on GPT 1T's pp16·v8,
        # and pricing them all made this bound 20× slower for little strength): with at most κ blocks
        # in a chunk (the end layer's chunk: at most what fits beside it in κ blocks' time), the least bytes put
        # one block in every chunk that must hold one and fill the chunks holding fewest micro-batches first, up
        # to κ. Bytes fall as κ grows, so where the cut the time bound allows does not fit, the least κ that
        # fits is found by bisection (on those counts only: most fit at once or not at all); below it none fits.
        def fits(kappa, at):
            caps = np.where(timed[at], kappa, N[at])
            end_cap = np.where(timed[at], kappa - spare[at], N[at])
            least = _least_held(held, N[at], caps, end_cap, end_chunk, empty)
            end = 0.0 if end_chunk is None else held[end_chunk] * Xa[at] + held[v - 1] * head[3]
            return static[at] + Ma[at] * least + end <= capacity

        hi, lo = top.copy(), within.copy()
        found = fits(hi, every) & (N >= at_least)
        at = every[found & timed]
        at = at[~fits(lo[at], at)]
        while len(at) and np.any(hi[at] - lo[at] > 1):
            mid = np.floor((lo[at] + hi[at]) / 2)
            ok = fits(mid, at)
            hi[at], lo[at] = np.where(ok, mid, hi[at]), np.where(ok, lo[at], mid)
            at = at[hi[at] - lo[at] > 1]
        forced = M.copy()
        raised = every[found & timed]
        raised = raised[hi[raised] <= N[raised] + spare[raised]]  # a cut within the caps had to be found
        # κ − 1 does not fit: every cut that fits has a chunk without the end layer of at least κ blocks, or the
        # end layer's chunk beyond its cap κ − spare (had neither, the cut would fit under κ − 1), so the largest
        # is at least κ·T, or min(κ·T, x + (κ − spare)·T) with an end layer (at least (κ − 1)·T: x ≥ (spare − 1)·T).
        least = hi[raised] * T[raised]
        if end_chunk is not None:
            least = np.minimum(least, X[raised] + (hi[raised] - spare[raised]) * T[raised])
        forced[raised] = np.maximum(M[raised], least)
        return np.where(found, forced, math.inf).reshape(-1, len(n))

    rates = [np.broadcast_to(rate, shape[:2]).ravel() for rate in (t[:, None], x[None, :], gk[:, None], xg[None, :],
                                                                   it[:, None], xi[None, :])]
    byte_rates = [np.broadcast_to(rate, shape[:2]).ravel() for rate in (ms[:, None], ma[:, None], xm[None, :],
                                                                        xa[None, :])]
    cut = [np.broadcast_to(arr, (3, *shape)).reshape(3, -1, len(n)) for arr in (levels, counts)]
    return (*(np.broadcast_to(arr, shape).reshape(-1, len(n)) for arr in (a, largest, g)), *cut,
            np.broadcast_to(extra, shape).reshape(-1, len(n)), largest_fitting, rates, byte_rates)


def _least_held(held: np.ndarray, n: np.ndarray, caps: np.ndarray, end_cap: np.ndarray,
                end_chunk: int | None, empty: tuple[int, ...] = ()) -> np.ndarray:
    """The least Σ_k held_k·n_k over block counts n_k per chunk adding up to n, each chunk at least one block
    (the end layer's chunk and those in `empty` at least none) and at most `caps` (the end layer's `end_cap`);
    inf where none does."""
    least = np.ones(len(held))
    least[list(empty)] = 0.0
    if end_chunk is not None:
        least[end_chunk] = 0.0
    total = np.full(n.shape, float(held @ least))
    left = n - least.sum()
    short = left < 0  # fewer blocks than chunks that must hold one
    for k in np.argsort(held, kind="stable"):
        cap = end_cap if k == end_chunk else caps
        short |= cap < least[k]
        take = np.clip(np.minimum(left, cap - least[k]), 0.0, None)
        total += held[k] * take
        left = left - take
    return np.where(short | (left > 0), math.inf, total)


def _end_group_largest(t: np.ndarray, x: np.ndarray, n: np.ndarray, v: int) -> np.ndarray:
    """(K, E, n): the least largest chunk of a group holding the end layer (time x) and n blocks (time t), each
    of its other v − 1 chunks at least one block. With κ blocks in the fullest other chunk, the end layer's chunk
    holds at least (n − (v − 1)·κ)⁺ of them, so the largest chunk is f(κ) = max(x + (n − (v−1)·κ)⁺·t, κ·t),
    κ ≤ ⌈n / (v − 1)⌉; f falls then rises, so its least is at the crossing κ₀ = ⌈(x/t + n)/v⌉ or just before
    it, or at that largest κ."""
    T, X, N = t[:, None, None], x[None, :, None], n[None, None, :]
    top = np.maximum(np.ceil(N / (v - 1)), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.ceil((np.where(T > 0, X / T, 0.0) + N) / v)
    best = np.full(np.broadcast_shapes(T.shape, X.shape, N.shape), math.inf)
    for kappa in (cross - 1, cross, top):
        kappa = np.clip(kappa, 1.0, top)
        best = np.minimum(best, np.maximum(X + np.maximum(N - (v - 1) * kappa, 0.0) * T, kappa * T))
    return best


def _kept(reduced: Reduced, run) -> tuple[np.ndarray, ...]:
    """(A, G, Ms, Ma, I) of the run's strategies that no other beats in all five, I the input passes of a split
    backward ((1 − FORWARD_SHARE)·A − W; 0 otherwise): a dominated one never lowers the bound. An end layer keeps
    its strategies' own bytes too: priced at the least bytes of any, the fastest embedding of Megatron's 530B on
    280 A100 (pp14·v4) fitted a first group that no plan fits, and the bound (38.28 s) stayed under the search's
    incumbent (38.36 s), which the device-group MILP then took 6-12 s to prove; with them it is 39.05 s. Last:
    their indices in run.keep."""
    tables = [table[run.first, run.keep] for table in (reduced.A, reduced.G, reduced.Ms, reduced.Ma)]
    tables.append(np.zeros(len(run.keep)) if reduced.W is None else
                  (1 - FORWARD_SHARE) * tables[0] - reduced.W[run.first, run.keep])
    index = np.arange(len(run.keep))
    keep = undominated(index, np.zeros(len(index), dtype=int), tables)
    return (*(table[keep] for table in tables), np.flatnonzero(keep))


def _window(a, M, g, fits, levels, counts, extra) -> tuple:
    """(first block count, a, M, g, penalty, levels, counts, rows) of a group over the window of counts where some
    choice fits and the choices that fit one of them (`rows`, their indices); penalty is the group's bubble share
    `extra` where a choice fits a count and inf where not."""
    held = np.flatnonzero(fits.any(axis=0))
    lo, hi = int(held[0]), int(held[-1]) + 1
    rows = fits[:, lo:hi].any(axis=1)
    a, M, g, fits, extra = (arr[rows, lo:hi] for arr in (a, M, g, fits, extra))
    levels, counts = (arr[:, rows, lo:hi] for arr in (levels, counts))
    return lo, a, M, g, np.where(fits, extra, math.inf), levels, counts, np.flatnonzero(rows)


def _breakpoints(v: int, a, M, g, fits, levels, counts, extra, whole: bool = True) -> np.ndarray:
    """The slots where a group's bound (`_slot_values`) changes slope, over the counts that fit: M, the cut's
    chunk times, where its excess meets a − v·b, and (`whole`: the most even cut priced whole) where a − v·b
    meets M − b and the excess meets M − b."""
    found = [M[fits], levels[(counts > 0) & fits[None]],
             _crossings(levels[:, fits], counts[:, fits], a[fits], float(v))]
    if whole:
        with np.errstate(divide="ignore", invalid="ignore"):
            meet = (a - M) / (v - 1)
        found += [np.maximum(meet[fits], 0.0), _crossings(levels[:, fits], counts[:, fits], M[fits], 1.0)]
    return np.concatenate(found)


def _crossings(levels: np.ndarray, counts: np.ndarray, alpha: np.ndarray, beta: float) -> np.ndarray:
    """The slots b ≥ 0 where a cut's excess Σ_i counts_i·(levels_i − b)⁺ (levels (3, n)) meets the line
    alpha − beta·b: on the stretch below the i-th highest level the excess is S_i − k_i·b, k_i the chunks above
    and S_i their total, so the line meets it at (S_i − alpha)/(k_i − beta) if that lies on the stretch."""
    order = np.argsort(-levels, axis=0)
    high, many = np.take_along_axis(levels, order, axis=0), np.take_along_axis(counts, order, axis=0)
    above, total = np.cumsum(many, axis=0), np.cumsum(many * high, axis=0)
    below = np.concatenate([high[1:], np.zeros((1, high.shape[1]))])
    with np.errstate(divide="ignore", invalid="ignore"):
        at = (total - alpha[None]) / (above - beta)
    tol = 1e-12 * np.maximum(np.abs(high), 1e-30)
    real = np.isfinite(at) & (at >= below - tol) & (at <= high + tol) & (at >= 0) & (many > 0)
    return at[real]


class Pricing(NamedTuple):
    """How a schedule prices a device group at slot B: own·b + rate·(its chunks' excess over b), plus (a split
    backward) its share of the bubble, forward·a + input·i, a its time and i its input passes."""

    rate: float
    """Per unit of excess: c, less a split backward's σ/v and what its bubble share takes back."""
    own: float
    """1 under interleaved 1F1B (each group's own slot b_d), 0 under a split backward."""
    forward: float
    """Per unit of a group's time: a⁺·FORWARD_SHARE / (S − v) under a split backward; 0 under interleaved 1F1B."""
    input: float
    """Per unit of a group's input passes: b⁺ / (S − v) under a split backward; 0 under interleaved 1F1B."""
    sends: float
    """What every plan pays in sends: under interleaved 1F1B each of the S − 1 boundaries, at least the S − 1
    cheapest edges; under a split backward κ times the largest, at least the (S − 1)-th least edge, less what the
    bubble's piece takes back of them."""

    def slope(self, v: int) -> float:
        """Of the bound in B: rate·v − own."""
        return self.rate * v - self.own


def _pricing(program: StageProgram) -> Pricing:
    """Interleaved 1F1B: Σ_d b_d + (c·v − 1)·B + c·Σ_j (p_j − b_d)⁺. A split backward: c times its v longest
    chunks X plus its bubble, at least a⁺·F̂ + b⁺·Î − σ·p_v (solve.program.bubble_terms), with F̂ at least the
    mean forward FORWARD_SHARE·(Σ_j p_j − X)/(S − v) of the chunks beyond the v longest, Î at least their mean
    input pass (Σ_j I_j − (1 − FORWARD_SHARE)·X)/(S − v) (no chunk's input pass is above that share of its
    time), and p_v ≤ X/v. X = min over B of v·B + Σ_j (p_j − B)⁺, so every B gives rate·(v·B + Σ_j (p_j − B)⁺)
    + Σ_d (forward·a_d + input·i_d), i_d = (1 − FORWARD_SHARE)·a_d − (its weight passes) a group's input passes
    (resharding only adds to Σ_j p_j and Σ_j I_j), where rate = c − σ/v − (a⁺·FORWARD_SHARE + b⁺·(1 −
    FORWARD_SHARE))/(S − v) is positive (else the bubble is left out)."""
    c = program.micro_batches
    ok = np.asarray(program.allowed)
    if program.split_schedule is None:
        return Pricing(float(c), 1.0, 0.0, 0.0, least_sends(program, ok))
    v, rest = program.virtual_stages, max(program.stages - program.virtual_stages, 1)
    bubble = bubble_terms(program)
    largest_send = least_largest_send(program, ok)
    rate = c - bubble.longest / v - (bubble.forward * FORWARD_SHARE + bubble.input * (1 - FORWARD_SHARE)) / rest
    if rate <= 0:  # the bubble left out, and with it what its piece takes back of the sends
        return Pricing(float(c), 0.0, 0.0, 0.0, split_send_hops(program) * largest_send)
    return Pricing(rate, 0.0, bubble.forward * FORWARD_SHARE / rest, bubble.input / rest,
                   max(split_send_hops(program) - bubble.sends, 0) * largest_send)


def _slot_cost(B: np.ndarray, v: int, omega: float, pricing: Pricing, lo: int, a, M, g, penalty,
               levels, counts) -> tuple[int, np.ndarray]:
    """(first block count, (len(B), counts)): the least bound of the group over its choices, at each slot B and
    each block count it can hold (its `_window`: outside it nothing fits)."""
    return lo, _slot_values(B, v, omega, pricing, a, M, g, penalty, levels, counts).min(axis=1)


def _slot_values(B: np.ndarray, v: int, omega: float, pricing: Pricing, a, M, g, penalty, levels,
                 counts) -> np.ndarray:
    """(len(B), choices, block counts): the group's bound under each choice, own·b + rate·E + ω·g + penalty
    (`Pricing`; interleaved 1F1B: b + c·E + ω·g) with b = min(B, M), M a least largest chunk, and E at least
    the excess over b of every cut the group can take: at least its largest chunk's, M − b, at least the most
    even cut's (`_most_even`: whole blocks, `levels` and how many chunks are at each), and at least a − v·b (a
    group holding both ends, whose head is not in that cut); the penalty (`_window`) holds a split backward's
    bubble share. 13 blocks in 6 chunks over a slot of 2.2 blocks have an excess of 1.6 blocks (two chunks of 3),
    where a − v·b sees 0.2."""
    rate, own = pricing.rate, pricing.own
    b = np.minimum(B[:, None, None], M[None])
    excess = np.subtract(M[None], b)
    part = np.multiply(b, -float(v))
    part += a[None]
    np.maximum(excess, part, out=excess)
    even = np.zeros_like(b)
    for level, count in zip(levels, counts):
        if not count.any():
            continue
        np.subtract(level[None], b, out=part)
        np.maximum(part, 0.0, out=part)
        part *= count[None]
        even += part
    np.maximum(excess, even, out=excess)
    excess *= rate
    b *= own
    excess += b
    excess += omega * g + penalty
    return excess


def _most_even(t: np.ndarray, x: np.ndarray | None, blocks: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    """(3, K, E, blocks + 1) twice: the chunk times of the most even cut of n = 0..blocks blocks of time t (per
    block strategy) into v chunks, the first also holding an end layer of time x (per end strategy; None: a
    middle group), and how many of its chunks take each: the first chunk, and the others at q + 1 and q blocks.
    The cut: each block in turn to the least loaded chunk (ties to the first). For identical blocks it is
    majorised by every other cut (the greedy is optimal for every separable convex cost), so no cut has a
    smaller largest chunk and every cut's Σ_k (l_k − b)⁺ is at least its own (`_slot_values`).

    Closed form: the greedy takes the n lowest starting levels, k·t in each of the other v − 1 chunks and x + k·t
    in the first. Below ⌊x/t⌋·t only the others' levels lie; past it each span of t holds v of them, the first
    chunk's last where x is not a whole number of blocks (first where it is). So the first chunk holds
    m = ⌊n'/v⌋ (+1 if it leads and n' mod v > 0) of them, n' = n − (v − 1)·⌊x/t⌋ when positive, and the others
    split n − m as evenly as whole blocks go."""
    ends = np.zeros(1) if x is None else np.asarray(x, dtype=float)
    T = np.asarray(t, dtype=float)[:, None, None]
    X = ends[None, :, None]
    n = np.arange(blocks + 1, dtype=float)[None, None, :]
    timed = T > 0
    step = np.where(timed, T, 1.0)
    whole = np.floor(X / step * (1 + 1e-12))  # whole blocks' worth of the end layer
    leads = np.abs(X - whole * step) <= 1e-12 * np.maximum(step, 1.0)  # x a whole number of blocks
    later = np.maximum(n - (v - 1) * whole, 0.0)
    m = np.where(timed, np.floor(later / v) + (leads & (later % v > 0)), 0.0)
    q, r = np.floor((n - m) / (v - 1)), (n - m) % (v - 1)
    shape = np.broadcast_shapes(T.shape, X.shape, n.shape)
    levels = np.stack([np.broadcast_to(level, shape) for level in (X + m * T, (q + 1) * T, q * T)])
    counts = np.stack([np.ones(shape), np.broadcast_to(r, shape), np.broadcast_to(v - 1 - r, shape)])
    if x is None:  # a middle group's first chunk is one of the others: two levels (`_slot_values` skips the third)
        counts[1] += m == q + 1
        counts[2] += m != q + 1
        levels[0], counts[0] = 0.0, 0.0
    return levels, counts


def _chain_dp(costs: list[tuple[int, np.ndarray]], blocks: int) -> np.ndarray:
    """(len(B),) min over block counts n_0 + … + n_{P−1} = blocks of Σ_d costs[d] at n_d (a min-plus
    convolution over each group's window of counts)."""
    low, F = costs[0]
    for lo, cost in costs[1:-1]:
        width = min(F.shape[1] + cost.shape[1] - 1, blocks + 1 - low - lo)
        if width <= 0:
            return np.full(F.shape[0], math.inf)
        out = np.full((F.shape[0], width), math.inf)
        for k in range(cost.shape[1]):
            span = min(F.shape[1], width - k)
            if span <= 0:
                break
            np.minimum(out[:, k:k + span], F[:, :span] + cost[:, k:k + 1], out=out[:, k:k + span])
        low, F = low + lo, out
    lo, cost = costs[-1]
    need = blocks - low - lo - np.arange(cost.shape[1])  # the earlier groups' share for each count of the last
    ok = (need >= 0) & (need < F.shape[1])
    if not ok.any():
        return np.full(F.shape[0], math.inf)
    return (F[:, need[ok]] + cost[:, ok]).min(axis=1)


def _contents(program: StageProgram, reduced: Reduced, kept, groups, choices, windows, blocks: int,
              pricing: Pricing, omega: np.ndarray, B: float, cap: float) -> list[np.ndarray] | None:
    """The group contents where the bound is least at slot B (weights `omega`, syncs at most `cap`): each
    group's block count and choice (`_least_picks`); per run, counts over its kept strategies (None if the DP is
    empty)."""
    picks = _least_picks(windows, v=program.virtual_stages, pricing=pricing, omega=omega, B=B, cap=cap,
                         blocks=blocks)
    if picks is None:
        return None
    counts = [np.zeros((program.pipeline_degree, len(run.keep)), dtype=int) for run in reduced.runs]
    for d, (window, (row, at)) in enumerate(zip(windows, picks)):
        kind = groups[d][0][0]
        ends = 1 if kind == "middle" else len(kept[0 if kind == "first" else 2][0])
        block, end = divmod(int(choices[d][window[-1][row]]), ends)  # the kind's choice: block × end strategy
        counts[1][d, kept[1][5][block]] = window[0] + at
        if kind != "middle":
            r = 0 if kind == "first" else 2
            counts[r][d, kept[r][5][end]] = 1
    return counts


def _least_picks(windows, v: int, pricing: Pricing, omega: np.ndarray, B: float, cap: float,
                 blocks: int) -> list[tuple[int, int]] | None:
    """Per group, (row of its window, count less the window's first) where the chain DP at slot B is least,
    backtracked through it; None if it is empty."""
    F = np.zeros(1)  # F[n]: the least cost of the groups so far holding n blocks
    steps = []
    for x, window in zip(omega, windows):
        lo, *priced = _capped(window, cap)
        values = _slot_values(np.array([B]), v, float(x), pricing, *priced)[0]  # (choices, counts)
        cost, choice = values.min(axis=0), values.argmin(axis=0)
        n = np.arange(min(len(F) + lo + len(cost) - 1, blocks + 1))
        before = n[:, None] - lo - np.arange(len(cost))[None, :]  # what the groups before hold
        total = np.where((before >= 0) & (before < len(F)), F[np.clip(before, 0, len(F) - 1)] + cost[None, :],
                         math.inf)
        k = total.argmin(axis=1)
        steps.append((k, choice, before[np.arange(len(n)), k]))
        F = total[np.arange(len(n)), k]
    if len(F) <= blocks or not math.isfinite(F[blocks]):
        return None
    picks, n = [], blocks
    for k, choice, before in reversed(steps):
        picks.append((int(choice[k[n]]), int(k[n])))
        n = int(before[n])
    return picks[::-1]
