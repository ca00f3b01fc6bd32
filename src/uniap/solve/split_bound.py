"""A lower bound on a zero-bubble program by its device groups' contents, before any MILP.

A split backward's TPI (solve.program.split_backward_tpi) is at least c times the v longest chunks, so at least
c times the busiest device group's work, plus the gradient sync of some group, plus κ times the largest send:
TPI ≥ max_d (c·a_d + g_d) + κ·ô, with a_d the A of the layers group d holds and g_d their G. For the usual chain
(an embedding, a run of identical blocks, a head) a group's contents are its end layers (the embedding on the
group of chunk 0, the head on the group of the last chunk: the last group, or the first under a V) and how many
blocks it runs under each strategy; so TPI ≤ T is possible only if the groups can hold every block with
c·a_d + g_d ≤ T and their bytes within the capacity under each of their occupancy patterns (`Group`). With more
than one chunk per group a group runs its blocks under one strategy (solve.reduce), so the most it holds is read
off each strategy; with one, it may mix them, and the most is a linear program with two rows (time and memory),
whose optimum mixes at most two strategies, so it is read off every pair. The least T for which the groups hold
the chain is found by bisection, and the lower end of the last bracket is taken. The bisection starts from what
whole blocks force: the v longest chunks hold at least v·q + min(v, r) of the N blocks (q, r = divmod(N, S)),
each at least the fastest block's time.

Added to it, what every plan pays beyond the groups' work: the bubble of the chunks beyond the v longest, which
hold at least their share of the work the v longest do not; and κ times the least largest send, the (S − 1)-th
least of the edges' least sends (S − 1 distinct edges are boundaries). An end layer's edge to the blocks adds
its resharding to its group (the two share a chunk) or, as a boundary, raises the largest send: κ times its excess
over that least, at most one such excess per group since only the largest send counts. What it leaves out (the
other sends and resharding, how the groups' work falls into chunks) only adds. On llama2-70b's zero-bubble
candidates it is within 0.3 % of the optimum, where the cheap `solve.program.lower_bound` is 5 % below it
(strategies that do not fit, the head's group).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from uniap.program import StageProgram, distinct_rows
from uniap.solve.one_block import one_block_relaxation
from uniap.solve.program import MEMORY_RTOL, bubble_terms, least_largest_send, split_send_hops

PRECISION = 1e-7
"""The bracket [a valid bound, a reachable T] is halved until it is this narrow, relative to T."""


def split_group_bound(program: StageProgram, floor: float, cutoff: float | None = None) -> float | None:
    """A lower bound on every plan of the split-backward `program` (math.inf if none fits), at least `floor` (a
    bound already known), for a chain of an embedding, one run of identical blocks and a head; a chain with
    blocks of several kinds is bounded on its one-block relaxation (solve.one_block). With a
    `cutoff` the answer is capped at it (a program that cannot beat it returns the cutoff). It reads the tables
    on their distinct rows (the `group` contract), without folding the program."""
    firsts, lengths = distinct_rows(program.group)
    if len(firsts) != 3 or lengths[0] != 1 or lengths[2] != 1:
        relaxed = one_block_relaxation(program)
        return None if relaxed is None else split_group_bound(relaxed, floor, cutoff)
    P, v, c, S = program.pipeline_degree, program.virtual_stages, program.micro_batches, program.stages
    cap = float(program.memory_capacity) * (1 + MEMORY_RTOL)
    held = program.group_moments
    ok = np.asarray(program.allowed)
    keep = [np.flatnonzero(ok[u]) for u in firsts]

    def rows(r):
        u, k = firsts[r], keep[r]
        return (c * np.asarray(program.A)[u, k] + np.asarray(program.G)[u, k], np.asarray(program.Ms)[u, k],
                np.asarray(program.Ma)[u, k])

    floor_send = least_largest_send(program, ok)
    bubble = bubble_terms(program)
    per_send = max(split_send_hops(program) - bubble.sends, 0)  # κ·ô, less what the bubble's piece may take back of it

    def edge(r):
        """(inside, as a send), each (K_r, K_r+1): what an end edge adds to its group as resharding in a chunk,
        and as a boundary, κ times its send's excess over the least largest send."""
        u = firsts[r + 1] - 1
        pick = np.ix_(keep[r], keep[r + 1])
        return (c * np.asarray(program.R)[u][pick],
                per_send * np.maximum(np.asarray(program.Rp)[u][pick] - floor_send, 0.0))

    block = rows(1)
    inside, send = edge(0)
    first = (*rows(0), inside, send, 0)  # the embedding, its edge to each block strategy, its chunk's position
    inside, send = edge(1)
    last = (*rows(2), inside.T, send.T, v - 1)  # the head, in its group's last chunk
    where = program.chunk_groups[[0, program.stages - 1]]  # the groups of the chain's first and last chunk
    groups = [Group([e for e, on in ((first, d == where[0]), (last, d == where[1])) if on], held[d], v == 1, cap,
                    block) for d in range(P)]

    def holds(T: float) -> bool:
        counts = [group.most_blocks(T) for group in groups]
        return all(n >= group.fewest for n, group in zip(counts, groups)) and sum(counts) >= lengths[1]

    # the bubble is at least ρ·p_{v+1} − σ·p_v − σ'·ô (solve.program.bubble_terms), p_v at most the mean of the v
    # longest, and the chunks beyond the v longest hold the rest of the chain's work, so the (v+1)-th longest
    # holds at least its share of it
    fastest = np.where(ok, np.asarray(program.A, dtype=float), np.inf)[firsts].min(axis=1)  # per distinct row
    work = float(fastest @ lengths)
    per_rest = bubble.following / max(S - v, 1)
    steady = 1 - bubble.longest / (c * v)  # of V: the v longest chunks' c·X less σ·X/v (the sync's share left out)
    sends = per_send * floor_send

    def total(V: float) -> float:
        """The bound for contents that need V (c·A + G of the busiest group)."""
        return steady * V + per_rest * max(work - V / c, 0.0) + sends

    def contents_for(T: float) -> float:
        """The V whose `total` is T (total rises with V: per_rest < c·steady)."""
        V = (T - sends - per_rest * work) / (steady - per_rest / c)
        return V if V <= c * work else (T - sends) / steady

    # Whole blocks: the S chunks hold the N blocks, so the v longest hold at least v·q + min(v, r) of them
    # (q, r = divmod(N, S)), each at least the fastest block's time; 96 blocks in 64 chunks put two in the v
    # longest, where the busiest group's share of the work is 1.5 per chunk.
    q, r = divmod(int(lengths[1]), S)
    lo = c * float(fastest[1]) * (v * q + min(v, r))
    if floor == math.inf:
        return floor if cutoff is None else float(cutoff)
    if cutoff is not None and total(lo) >= cutoff:
        return float(cutoff)
    if holds(lo):
        return max(floor, total(lo)) if cutoff is None else min(max(floor, total(lo)), float(cutoff))
    if cutoff is not None:
        hi = contents_for(float(cutoff))
        if hi <= 0 or not holds(hi):
            return float(cutoff)
    else:
        hi = max(contents_for(floor), 1e-9)
        while not holds(hi):
            hi *= 2
            if hi > 1e12 * max(floor, 1e-9):
                return math.inf
    while hi - lo > PRECISION * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if holds(mid) else (mid, hi)
    bound = max(floor, total(lo))
    return bound if cutoff is None else min(bound, float(cutoff))


class Group:
    """One device group of the bound: its end layers and occupancy patterns.

    Its bytes under a pattern q are Σ_k held[q, k]·(activations of chunk k) + static bytes. With n blocks, each
    chunk without an end layer holding at least one, the activations are at least those of one block in each
    such chunk and the rest in the chunk holding the fewest micro-batches: Ma·(H_q + (n − m)·h_q), H_q the
    held counts of the m chunks without an end layer, h_q the least count. With one chunk (`mix`) the group's
    blocks may mix strategies, and its peak is the largest count."""

    def __init__(self, ends, patterns: np.ndarray, mix: bool, cap: float, block):
        patterns = patterns[patterns.any(axis=1)]
        v = patterns.shape[1]
        free = np.ones(v, dtype=bool)
        free[[position for *_, position in ends]] = False
        self.ends, self.mix, self.patterns = ends, mix, patterns
        self.fewest = int(free.sum())  # each of its v chunks holds a layer
        base = patterns[:, free].sum(axis=1) - self.fewest * patterns.min(axis=1)  # H_q − m·h_q
        least = patterns.min(axis=1)  # h_q
        self.time, static, active = block
        # per combination of the end layers' strategies, what does not depend on the time T: (the ends' time,
        # the blocks' bytes each (mix only), the bytes left for the blocks)
        self.choices = []
        for extra, end_bytes in self._end_choices(len(self.time)):
            if mix:
                memory = static + float(patterns[:, 0].max()) * active
                self.choices.append((float(extra.min()), memory, cap - float(end_bytes.max())))
            else:
                # per pattern q and strategy k: n·(Ms + h_q·Ma) + Ma·(H_q − m·h_q) ≤ cap − end bytes under q
                room = (cap - end_bytes[:, None] - base[:, None] * active[None, :]) \
                    / (static[None, :] + least[:, None] * active[None, :])
                self.choices.append((extra, None, room.min(axis=0)))

    def most_blocks(self, T: float) -> float:
        """The most blocks the group can hold within time T (c·A + G, its end layers and their edges to the
        blocks included, each under the best strategy for this) and `cap` bytes under every pattern: under one
        block strategy or (`mix`) the LP over them (the end edges at their least), rounded down."""
        time = self.time
        best = -math.inf
        for extra, memory, room in self.choices:
            if self.mix:
                best = max(best, _lp_most(time, memory, T - extra, room))
                continue
            budget = (T - extra) / np.where(time > 0, time, np.nan)  # (K,)
            most = np.fmin(np.where(np.isnan(budget), np.inf, budget), room)
            most = np.where((extra <= T) & (room >= 0), most, -np.inf)
            best = max(best, float(most.max(initial=-math.inf)))
        return math.floor(best + 1e-9) if best > -math.inf else -math.inf

    def _end_choices(self, strategies: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(time per block strategy, bytes per pattern) of every combination of strategies of the end layers, their
        edges to the blocks included at their least: each end's resharding inside a chunk, or as a boundary its
        send's excess, the ends' resharding adding up and their excesses not (only the largest send counts).
        No end layer: zeros."""
        out = []
        for picks in itertools.product(*(range(len(end[0])) for end in self.ends)):
            time, held = np.zeros(strategies), np.zeros(len(self.patterns))
            edges = [(np.zeros(strategies), np.zeros(strategies))]  # (resharding summed, largest excess), per way
            for (times, static, active, inside, send, position), e in zip(self.ends, picks):
                time = time + times[e]
                held = held + static[e] + self.patterns[:, position] * active[e]
                edges = [way for r, x in edges for way in ((r + inside[e], x), (r, np.maximum(x, send[e])))]
            out.append((time + np.min([r + x for r, x in edges], axis=0), held))
        return out


def _lp_most(time: np.ndarray, memory: np.ndarray, budget: float, room: float) -> float:
    """max Σ n_k subject to Σ n_k·time_k ≤ budget, Σ n_k·memory_k ≤ room, n ≥ 0: at a vertex with one strategy,
    or two with both rows tight."""
    if room < 0 or budget < 0:
        return -math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        single = np.minimum(np.where(time > 0, budget / time, np.inf), np.where(memory > 0, room / memory, np.inf))
        best = float(single.max(initial=-math.inf))
        if len(time) < 2:
            return best
        # n_i·t_i + n_j·t_j = budget, n_i·m_i + n_j·m_j = room
        det = time[:, None] * memory[None, :] - time[None, :] * memory[:, None]
        n_i = (budget * memory[None, :] - room * time[None, :]) / det
        n_j = (room * time[:, None] - budget * memory[:, None]) / det
        ok = (det != 0) & (n_i >= 0) & (n_j >= 0)
        pairs = np.where(ok, n_i + n_j, -np.inf)
    return max(best, float(pairs.max(initial=-math.inf)))
