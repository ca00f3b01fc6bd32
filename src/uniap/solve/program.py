"""What the solver optimises: the cost tables of one pipeline configuration, and the one objective.

`evaluate` is *the* time per iteration (TPI) of a plan.

The chain is cut into `stages` contiguous pieces. Plain pipelines (GPipe, 1F1B) give each piece its own
devices; with p_i, o_i, g_i the per-micro-batch time of stage i, its boundary send (activation forward and
gradient back) and its once-per-iteration time,

    TPI = Σ p + Σ o + (c − 1) · max_i max(p_i + (o_{i−1} + o_i)/2, o_i) + max g

(the steady state is priced as if each stage also spent its sends: a send that hides behind compute in the
real schedule then costs a little extra, and one that does not is never under-priced).

The interleaved 1F1B schedule (Narayanan et al. 2021 §2.2) has v = `virtual_stages` pieces ("chunks") per
device group, chunk j on group j mod P, P = stages / v. Its steady state has c·v − 1 slots of a length B the
formula chooses; a chunk longer than its group's slot b_d = min(B, the group's largest chunk) adds its excess
once per micro-batch, and no slot is shorter than 1.5 sends (a send waits behind a chunk's forward, a third of it):

    TPI = min_B [Σ_d b_d + (c·v − 1)·B + c·Σ_j (p_j − b_d(j))⁺] + Σ_j o_j + max g

one slot per group and every send once to fill and drain the pipeline. On equal chunks this is the standard
(c·v + P − 1)·t; on unequal ones the schedule's order makes the short chunks wait for the long ones, so pricing
by the mean (as before) under-predicted by up to 1.47× and the solver exploited it. Both formulas bound the
event simulation of the schedules' operation order from above (report.timeline; tests/solve/
test_schedule_bounds.py checks it on random programs and on the plans the solver returns). Memory: a group's
static bytes plus its activations at the largest of its occupancy patterns (`held`). The MILP, the reference
solver, `estimate`, the baselines and the report all call `evaluate`, so a plan's predicted time is the same
number everywhere (on the tables as the plan runs them, `estimate.as_planned`: where a profile's ranks shared
cores, a plan's own stage times set their contention, and the search's tables assume balanced stages); the
MILP's own objective is only trusted after `evaluate` has recomputed it.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from uniap.errors import UniapError
from uniap.program import StageProgram, distinct_edges, distinct_rows
from uniap.schedules import FORWARD_SHARE, schedule_named

MEMORY_RTOL = 1e-6
"""Relative slack on the memory capacity in `evaluate`: the MILP states memory rows exactly, but a MILP solver
accepts rows violated by its feasibility tolerance (1e-7 of a row scaled to the capacity); the slack keeps what a
solver returns feasible here."""


@dataclass(frozen=True)
class Solution:
    """A plan for one program: where each layer runs and how, and what the search proved about it."""

    stage_of: np.ndarray  # (L,) int, 0-based stage of each layer, non-decreasing, every stage non-empty
    strategy_of: np.ndarray  # (L,) int
    objective: float  # TPI in seconds = evaluate(program, stage_of, strategy_of)
    optimal: bool
    gap: float  # relative MIP gap (0 when proven optimal)
    time_s: float
    solver: str


@dataclass(frozen=True)
class StageTimes:
    """Per-stage terms of the TPI, as `evaluate` combines them: per device group (P) and per chunk (S = P·v)."""

    p: np.ndarray  # (P,) seconds per micro-batch of each device group (its chunks' layers + resharding inside)
    o: np.ndarray  # (S-1,) seconds per micro-batch of each chunk boundary (send + gradient back)
    g: np.ndarray  # (P,) seconds once per iteration of each device group (grad sync, optimizer)
    memory: np.ndarray  # (P,) peak bytes per device of each device group
    chunk_p: np.ndarray  # (S,) seconds per micro-batch of each chunk (= p when v = 1)
    held: np.ndarray  # (S,) micro-batches whose activations each chunk holds at its device group's peak
    chunk_w: np.ndarray | None = None  # (S,) seconds of each chunk's weight pass (schedules that split the backward)

    @property
    def bottleneck(self) -> float:
        """The steady-state term of a plain pipeline: max_i max(p_i + (o_{i−1} + o_i)/2, o_i)."""
        return float(_plain_bottleneck(self.chunk_p[None, :], self.o[None, :])[0])


def _check_shapes(program: StageProgram, stage_of, strategies) -> tuple[np.ndarray, np.ndarray]:
    L, K = program.layers, program.strategies
    stage_of = np.asarray(stage_of)
    strategies = np.asarray(strategies)
    if stage_of.shape != (L,) or strategies.shape[-1:] != (L,):
        raise UniapError(f"a plan for {L} layers needs {L} stages and strategies, got {stage_of.shape} "
                         f"and {strategies.shape}")
    if not (np.issubdtype(stage_of.dtype, np.integer) and np.issubdtype(strategies.dtype, np.integer)):
        raise UniapError("stage and strategy indices must be integers")
    if strategies.size and (strategies.min() < 0 or strategies.max() >= K):
        raise UniapError(f"strategy index out of range 0..{K - 1}")
    if stage_of.min() < 0 or stage_of.max() >= program.stages:
        raise UniapError(f"stage index out of range 0..{program.stages - 1}")
    return stage_of, strategies


def _stages_valid(program: StageProgram, stage_of: np.ndarray) -> bool:
    """Contiguous, in order, every stage non-empty: stage ids go 0, …, P−1 in steps of 0 or 1."""
    steps = np.diff(stage_of)
    return bool(stage_of[0] == 0 and stage_of[-1] == program.stages - 1 and np.all((steps == 0) | (steps == 1)))


def _times_many(program: StageProgram, stage_of: np.ndarray, strategies: np.ndarray) -> tuple[np.ndarray, ...]:
    """p, o, g per chunk and memory per device group for N assignments (N, L) sharing one stage placement:
    arrays (N, S), (N, S−1), (N, S), (N, P) over the S = `stages` chunks (`_per_device` sums per device group).

    Entries of disallowed strategies are read as 0 (they may hold inf/nan); callers mask such rows.
    """
    P = program.stages
    n, L = strategies.shape
    layer = np.arange(L)
    ok = np.asarray(program.allowed)
    taken = ok[layer, strategies]  # (N, L); read the chosen entries first, then clear the disallowed ones
    A, G, Ms, Ma = (np.where(taken, np.asarray(t, dtype=float)[layer, strategies], 0.0)
                    for t in (program.A, program.G, program.Ms, program.Ma))
    onehot = np.zeros((L, P))
    onehot[layer, stage_of] = 1.0
    p = A @ onehot
    g = G @ onehot
    memory = _device_memory(program, Ms @ onehot, Ma @ onehot)
    o = np.zeros((n, P - 1))
    if L > 1:
        edge, first, then = layer[:-1], strategies[:, :-1], strategies[:, 1:]
        pair_ok = taken[:, :-1] & taken[:, 1:]  # (N, L−1)
        inner = np.where(pair_ok, np.asarray(program.R, dtype=float)[edge, first, then], 0.0)
        cross = np.where(pair_ok, np.asarray(program.Rp, dtype=float)[edge, first, then], 0.0)
        same = stage_of[:-1] == stage_of[1:]
        p += (inner * same) @ onehot[:-1]
        boundary = np.flatnonzero(~same)  # edge u crosses from stage stage_of[u] to stage_of[u] + 1
        o[:, stage_of[boundary]] = cross[:, boundary]
    return p, o, g, memory


def _device_memory(program: StageProgram, static: np.ndarray, activation: np.ndarray) -> np.ndarray:
    """(N, P) peak bytes per device group from per-chunk static bytes and activation bytes per micro-batch (N, S)."""
    if program.held is None:
        return _per_device(program, static + activation * np.asarray(program.inflight, dtype=float))
    chunks = program.group_chunks  # [d, k]: group d's position-k chunk
    held = np.asarray(program.held, dtype=float)
    peak = np.stack([(activation[:, chunks[d]] @ held[d].T).max(axis=1) for d in range(program.pipeline_degree)],
                    axis=1)
    return _per_device(program, static) + peak


def _per_device(program: StageProgram, per_chunk: np.ndarray) -> np.ndarray:
    """(N, P) sums over each device group's chunks of an (N, S) per-chunk array."""
    return per_chunk[:, program.group_chunks].sum(axis=2)


def _feasible_many(program: StageProgram, strategies: np.ndarray, memory: np.ndarray) -> np.ndarray:
    allowed = np.asarray(program.allowed)[np.arange(program.layers), strategies].all(axis=1)
    fits = (memory <= program.memory_capacity * (1 + MEMORY_RTOL)).all(axis=1)
    return allowed & fits


SEND_HIDING = 1.5
"""An interleaved chunk slot lasts at least 1.5 sends: the timeline gives a forward a third of a chunk's time and
each direction half a send, and a send hides behind the next chunk's forward only when it is no longer (beyond
that, the event simulation grows faster than the sends: tests/solve/test_schedule_bounds.py)."""


def _tpi(program: StageProgram, p: np.ndarray, o: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """(N,) TPI without the gradient sync, from per-chunk times p (N, S), sends o (N, S − 1) and, for a schedule
    that splits the backward, its weight passes w (N, S)."""
    c, v = program.micro_batches, program.virtual_stages
    if program.split_schedule is not None:
        return split_backward_tpi(program, p, o, w)
    sends = o.sum(axis=1)
    if v == 1:
        return p.sum(axis=1) + sends + (c - 1) * _plain_bottleneck(p, o)
    return interleaved_slots(program, p, o)[0] + sends


def split_backward_tpi(program: StageProgram, p: np.ndarray, o: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(N,) TPI without the gradient sync of a schedule that splits the backward (zero bubble), from per-chunk
    times p (N, S), sends o (N, S − 1) and weight passes w (N, S):

        min over levels (F̂, Î, Ŵ) ≥ ô of  Σ_x c·(v·x̂ + Σ_j (x_j − x̂)⁺)  +  max_pieces(F̂, Î, Ŵ)  +  κ·ô

    over the passes x = F, I, W of the chunks (`split_passes`), with ô the largest send, κ = (S − 1) + 2·(P − 1)
    (every boundary once, and the fill's and the drain's hops once more) and the schedule's `bubble` pieces.

    Why it bounds the event simulation of the schedule's order (report.timeline) from above: that simulation is
    the longest path through the operations, so it rises with every duration and send; a path holds at most c
    operations of each kind of each chunk, so lowering a chunk's F, I or W by δ lowers it by at most c·δ. So
    with every send at ô and every pass at most its level, it is at most the equal-chunk time at the levels
    plus c times each pass's excess over its level. On equal chunks the time is c·v·(F + I + W) + max_pieces(F,
    I, W) (`Schedule.bubble`), and sends of ô ≤ min(F, I, W) add at most κ·ô (measured on 1,472 random
    equal-chunk pipelines up to P = 16, v = 8, and on the V schedules: at most κ − 1; tests/solve/
    test_solve_zero_bubble.py). The least over the levels is exact: each level's own terms are flat between its
    v-th and (v+1)-th longest pass and rise at least c per unit outside, more than the bubble's slope (below c
    for every schedule: c ≥ P, or ≥ 2P for the V schedules), so the levels lie in that box, where the bubble's
    least is a small linear program (`least_bubble`). Above ô, Σ_x c·(…) is c times the v longest passes of
    each kind. On equal chunks without sends it is exact; on uneven ones about as tight as the interleaved
    formula (tests/solve/test_schedule_bounds.py)."""
    schedule = schedule_named(program.split_schedule)
    c, v, P = program.micro_batches, program.virtual_stages, program.pipeline_degree
    passes = split_passes(p, w)
    send = o.max(axis=1, initial=0.0)
    low, high = split_levels(passes, v, send)
    value = sum(c * (v * level + np.maximum(x - level[:, None], 0.0).sum(axis=1))
                for x, level in zip(passes, high.T))
    return value + least_bubble(schedule.bubble(P), low, high)[0] + split_send_hops(program) * send


def split_passes(p: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F, I, W), each (N, S): every chunk's forward (a third of its time, FORWARD_SHARE), its input pass (the
    rest less the weight pass) and its weight pass."""
    F = p * FORWARD_SHARE
    return F, p - F - w, w


def split_levels(passes, v: int, send: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high), each (N, 3): the box of levels (F̂, Î, Ŵ) where `split_backward_tpi`'s least lies, from each
    kind's (v+1)-th longest pass to its v-th, none below the largest send (then the box is that send)."""
    ordered = [-np.sort(-x, axis=1) for x in passes]
    below = min(v, ordered[0].shape[1] - 1)  # the (v+1)-th longest (one stage: every chunk is in the steady state)
    low = np.stack([np.maximum(x[:, below], send) for x in ordered], axis=1)
    high = np.stack([np.maximum(x[:, v - 1], send) for x in ordered], axis=1)
    return low, high


def least_bubble(pieces, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((N,) the least over the box [low, high] (N, 3) of max_q pieces_q · (F̂, Î, Ŵ), (N, 3) where): a linear
    program in three variables, solved by trying its vertices (`_bubble_vertices`: a coordinate at either end of
    its range, or where pieces tie), as points linear in the box's ends."""
    maps, A = _bubble_vertices(tuple(tuple(float(x) for x in q) for q in pieces))
    ends = np.concatenate([low, high], axis=1)  # (N, 6)
    points = np.einsum("cij,nj->nci", maps, ends)  # (N, vertices, 3)
    tol = 1e-12 * np.maximum(np.abs(ends).max(axis=1), 1.0)[:, None, None]
    inside = ((points >= low[:, None, :] - tol) & (points <= high[:, None, :] + tol)).all(axis=2)
    values = np.where(inside, (points @ A.T).max(axis=2), np.inf)
    best = values.argmin(axis=1)
    rows = np.arange(len(best))
    return values[rows, best], points[rows, best]


@functools.lru_cache(maxsize=64)
def _bubble_vertices(pieces: tuple[tuple[float, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    """(maps (vertices, 3, 6), pieces (Q, 3)): every vertex of min over a box of max_q a_q·x, as a linear map of
    the box's ends (low, high): each coordinate at its low or high end, or free, with as many ties between pieces
    as free coordinates (a_q·x = a_q'·x; the pieces have no constant term)."""
    A = np.array(pieces, dtype=float)
    maps = []
    for pattern in itertools.product(("low", "high", "free"), repeat=3):
        free = [k for k in range(3) if pattern[k] == "free"]
        fixed = np.zeros((3, 6))  # x = fixed @ (low, high) on the fixed coordinates
        for k in range(3):
            if pattern[k] != "free":
                fixed[k, k + (3 if pattern[k] == "high" else 0)] = 1.0
        if not free:
            maps.append(fixed)
            continue
        for tied in itertools.combinations(range(len(A)), len(free) + 1):
            diff = A[list(tied[1:])] - A[tied[0]]  # (f, 3): diff·x = 0
            square = diff[:, free]
            if abs(np.linalg.det(square)) < 1e-12:
                continue
            solved = fixed.copy()
            solved[free] = -np.linalg.solve(square, diff @ fixed)  # x_free = −M⁻¹·(diff on the fixed part)
            maps.append(solved)
    return np.array(maps), A


def split_send_hops(program: StageProgram) -> int:
    """κ of `split_backward_tpi`: the sends a split-backward pipeline waits for, (S − 1) + 2·(P − 1)."""
    return program.stages - 1 + 2 * (program.pipeline_degree - 1)


def _weight_passes(program: StageProgram, stage_of: np.ndarray, strategies: np.ndarray) -> np.ndarray | None:
    """(N, S) weight-pass seconds per chunk, for a schedule that splits the backward; None otherwise."""
    if program.weight_gradient is None:
        return None
    ok = np.asarray(program.allowed)
    W = np.where(ok, np.asarray(program.weight_gradient, dtype=float), 0.0)[np.arange(program.layers), strategies]
    onehot = np.zeros((program.layers, program.stages))
    onehot[np.arange(program.layers), stage_of] = 1.0
    return W @ onehot


def interleaved_slots(program: StageProgram, p: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, ...]:
    """The interleaved steady state of N plans (per-chunk times p (N, S), sends o (N, S − 1)): (value (N,), slot
    B (N,), group slots b (N, P), excess (N, S)) minimising

        Σ_d b_d + (c·v − 1)·B + c·Σ_j (p_j − b_d(j))⁺,   b_d = max(min(B, largest chunk of d), 1.5·max o) ≤ B

    over B: every slot of the steady state lasts B, a chunk longer than its group's b_d adds its excess once
    per micro-batch. The minimum is at one of the chunk times (or at 1.5·max o), so those are tried."""
    c, v, P = program.micro_batches, program.virtual_stages, program.pipeline_degree
    n, S = p.shape
    floor = SEND_HIDING * o.max(axis=1, initial=0.0)  # (N,)
    largest = np.maximum(p.reshape(n, v, P).max(axis=1), floor[:, None])  # (N, P), chunk j = k·P + d
    trial = np.maximum(np.concatenate([p, floor[:, None]], axis=1), floor[:, None])  # (N, T) candidate B
    b = np.minimum(trial[:, :, None], largest[:, None, :])  # (N, T, P)
    excess = np.maximum(p[:, None, :] - np.tile(b, (1, 1, v)), 0.0)  # (N, T, S): chunk j against b of j mod P
    value = b.sum(axis=2) + (c * v - 1) * trial + c * excess.sum(axis=2)
    best = value.argmin(axis=1)
    rows = np.arange(n)
    return value[rows, best], trial[rows, best], b[rows, best], excess[rows, best]


def _plain_bottleneck(p: np.ndarray, o: np.ndarray) -> np.ndarray:
    """(N,) max_i max(p_i + (o_{i−1} + o_i)/2, o_i) of plain pipelines (N, P) and their sends (N, P − 1)."""
    zero = np.zeros((p.shape[0], 1))
    around = (np.concatenate([zero, o], axis=1) + np.concatenate([o, zero], axis=1)) / 2
    return np.maximum((p + around).max(axis=1), o.max(axis=1, initial=0.0))


def evaluate_many(program: StageProgram, stage_of, strategies) -> np.ndarray:
    """TPI of N strategy assignments (N, L) under one stage placement; inf where infeasible.

    Vectorised `evaluate` (same formula, same checks): the reference solver enumerates with it.
    """
    stage_of, strategies = _check_shapes(program, stage_of, strategies)
    strategies = strategies.reshape(-1, program.layers)
    out = np.full(strategies.shape[0], math.inf)
    if not _stages_valid(program, stage_of):
        return out
    p, o, g, memory = _times_many(program, stage_of, strategies)
    value = _tpi(program, p, o, _weight_passes(program, stage_of, strategies)) + _per_device(program, g).max(axis=1)
    ok = _feasible_many(program, strategies, memory)
    out[ok] = value[ok]
    return out


def evaluate(program: StageProgram, stage_of, strategy_of) -> float:
    """The TPI in seconds of a plan, or math.inf when it is infeasible (memory exceeded, a disallowed strategy,
    stages not contiguous and in order, or an empty stage). Malformed input raises UniapError."""
    return float(evaluate_many(program, stage_of, np.asarray(strategy_of)[None, :])[0])


def stage_times(program: StageProgram, stage_of, strategy_of) -> StageTimes:
    """The per-stage terms `evaluate` combines (computed even when the plan is infeasible, so a report can show
    why; stages must still be contiguous and non-empty)."""
    stage_of, strategy_of = _check_shapes(program, stage_of, strategy_of)
    if not _stages_valid(program, stage_of):
        raise UniapError("stages must be contiguous, in layer order and non-empty")
    p, o, g, memory = _times_many(program, stage_of, strategy_of[None, :])
    return StageTimes(p=_per_device(program, p)[0], o=o[0], g=_per_device(program, g)[0], memory=memory[0],
                      chunk_p=p[0], held=_peak_held(program, stage_of, strategy_of),
                      chunk_w=None if program.weight_gradient is None
                      else _weight_passes(program, stage_of, strategy_of[None, :])[0])


def _peak_held(program: StageProgram, stage_of: np.ndarray, strategy_of: np.ndarray) -> np.ndarray:
    """(S,) per chunk: the micro-batches it holds in the occupancy pattern that gives its group's peak."""
    infl = np.asarray(program.inflight, dtype=float)
    if program.held is None:
        return infl.copy()
    ok = np.asarray(program.allowed)
    ma = np.where(ok, np.asarray(program.Ma, dtype=float), 0.0)[np.arange(program.layers), strategy_of]
    per_chunk = np.bincount(stage_of, weights=ma, minlength=program.stages)
    held = np.asarray(program.held, dtype=float)
    out = np.empty(program.stages)
    for d, chunks in enumerate(program.group_chunks):
        out[chunks] = held[d][int(np.argmax(held[d] @ per_chunk[chunks]))]
    return out


def lower_bound(program: StageProgram) -> float:
    """A cheap valid lower bound on the TPI of any plan of `program` (math.inf if provably infeasible).

    With S = Σ_u min_k A[u,k] over allowed k: Σ p ≥ S, the bottleneck ≥ S/P and ≥ the slowest single layer,
    max g ≥ Σ_u min_k G[u,k] / P. Memory: every layer must fit on some stage on its own, and all stages
    together hold at least Σ_u min_k (Ms + min_i inflight_i · Ma). The memory-aware `_memory_dual_bound` is
    often far tighter (the fastest strategies are the ones that do not fit), and the UOP orders and skips
    candidates by it.
    """
    ok = np.asarray(program.allowed)
    if not ok.any(axis=1).all():
        return math.inf
    rows, count = distinct_rows(program.group)  # every sum below runs over the distinct rows, weighted
    ok = ok[rows]

    def row_min(table):
        return np.where(ok, np.asarray(table, dtype=float)[rows], math.inf).min(axis=1)

    infl = np.asarray(program.inflight, dtype=float)
    cap = program.memory_capacity * (1 + MEMORY_RTOL)
    Ms = np.where(ok, np.asarray(program.Ms, dtype=float)[rows], 0.0)
    Ma = np.where(ok, np.asarray(program.Ma, dtype=float)[rows], 0.0)
    least = np.where(ok, Ms + infl.min() * Ma, math.inf).min(axis=1)
    P = program.pipeline_degree  # device groups: memory and the bottleneck are per group
    if least.max() > cap or least @ count > P * cap:
        return math.inf
    a = row_min(program.A)
    S, v = float(a @ count), program.virtual_stages
    sync = float(row_min(program.G) @ count) / P
    memory = Ms + infl.min() * Ma
    if program.split_schedule is not None:
        # the v chunks holding the most layers of one kind hold at least v·q + min(v, r) of its n (n = q·S + r)
        most = v * (count // program.stages) + np.minimum(v, count % program.stages)
        held = max(float(a.max()), float((most * a).max()))
        return max(_split_bound(program.micro_batches, v, S, held, P, bubble_terms(program)) + sync,
                   _memory_dual_bound(program, memory, cap * P, rows, count))
    sends = least_sends(program, np.asarray(program.allowed))
    simple = (S + sends) / v + (program.micro_batches - 1 / v) * max(S / P, float(a.max())) + sync
    if v > 1:
        largest = max(float(a.max()), float((np.ceil(count / program.stages) * a).max()))
        simple = max(simple, _slots_bound(P, program.micro_batches, v, S, largest) + sends + sync)
    return max(simple, _memory_dual_bound(program, memory, cap * P, rows, count) + sends / v)


def _split_bound(c: int, v: int, S: float, held: float, P: int, bubble: Bubble) -> float:
    """A lower bound on `split_backward_tpi` (without the sync) for chunk times adding up to at least S whose v
    longest chunks hold at least `held` (the largest layer; ⌈n / (P·v)⌉ of n identical layers in one chunk and
    their share of the rest in each of the next v − 1: 80 blocks in 48 chunks put two in each of the v longest).
    Its steady state is at least c times the v longest chunks T ≥ max(S/P, held), and its bubble at least
    ρ·p_{v+1} − σ·p_v (`bubble_terms`; the sends' share of it is left out with the sends, κ ≥ its coefficient),
    p_v ≤ T/v and the (v+1)-th longest chunk at least the mean b ≥ (S − T)/(P·v − v) of the chunks beyond the v
    longest. (c − σ/v)·T + ρ·(S − T)/(P·v − v) is linear in T on [max(S/P, held), S] and (c − σ/v)·T beyond, so
    its least is at an end; equal chunks give (c − σ/v)·S/P + ρ·S/(P·v)."""
    T = max(S / P, held)
    steady = c - bubble.longest / v
    return min(steady * T + bubble.following * max(S - T, 0.0) / max(P * v - v, 1), steady * max(S, T))


class Bubble(NamedTuple):
    """A split backward's bubble is at least following·p_{v+1} − longest·p_v − sends·ô: p_k the k-th longest
    chunk's time, ô the largest send (`bubble_terms`); and at least forward·F̂ + input·Î − longest·p_v − sends·ô
    over its levels, which the device-group DP reads with each group's own passes (solve.group_bound)."""

    following: float
    longest: float
    sends: float
    forward: float
    """The piece's positive forward coefficient a⁺."""
    input: float
    """The piece's positive input-pass coefficient b⁺."""


def bubble_terms(program: StageProgram) -> Bubble:
    """What the bounds take from a split backward's bubble: one of its pieces (a, b, d), at the levels where the
    closed form is least (`split_backward_tpi`), each level between its kind's (v+1)-th and v-th longest pass
    (or the largest send ô above both). A positive coefficient's level is at least the (v+1)-th longest pass,
    a negative one's at most the v-th longest or ô. A chunk's forward is FORWARD_SHARE of its time p, its input
    pass at least 1 − FORWARD_SHARE − ŵ of it and at most 1 − FORWARD_SHARE, its weight pass at most ŵ of it,
    ŵ the largest weight share of any layer's time (resharding in the chunk only adds to p), so v + 1 chunks
    have passes at least those shares of p_{v+1}, and at most v − 1 have more than those shares of p_v. The
    weight pass's lower side is left out: resharding adds to a chunk's time, not to its weight pass. The piece
    taken is the one worth most on equal chunks of the fastest layers with the least largest send, of those the
    bounds can use. ZB1P on 32 stages with ŵ = 0.3:
    31·(1/3 + 0.367)·p_{v+1} − 31·0.3·p_v, 0.4·31·p on equal chunks (its exact bubble there), where its
    forward alone gave 31/3."""
    ok = np.asarray(program.allowed)
    A = np.asarray(program.A, dtype=float)
    W = np.asarray(program.weight_gradient, dtype=float)
    timed = ok & (A > 0)
    share = float((W[timed] / A[timed]).max(initial=0.0))
    low = (FORWARD_SHARE, max(1.0 - FORWARD_SHARE - share, 0.0), 0.0)  # least share of p_{v+1} per pass
    high = (FORWARD_SHARE, 1.0 - FORWARD_SHARE, share)  # most share of p_v per pass
    c, v, S = program.micro_batches, program.virtual_stages, program.stages
    chunk = float(np.where(ok, A, math.inf).min(axis=1).sum()) / S  # an equal chunk's time
    send = least_largest_send(program, ok)
    best, worth = Bubble(0.0, 0.0, 0.0, 0.0, 0.0), 0.0
    for piece in schedule_named(program.split_schedule).bubble(program.pipeline_degree):
        term = Bubble(sum(max(x, 0.0) * s for x, s in zip(piece, low)),
                      sum(max(-x, 0.0) * s for x, s in zip(piece, high)), sum(max(-x, 0.0) for x in piece),
                      max(piece[0], 0.0), max(piece[1], 0.0))
        # the bounds need what the v longest chunks pay to rise with them (c − σ/v − ρ/(S − v) > 0), and the
        # sends to pay for what the piece takes back of them (κ ≥ σ'; the cheap bound leaves both out)
        rises = c - term.longest / v - term.following / max(S - v, 1) > 0 and term.sends <= split_send_hops(program)
        if rises and (term.following - term.longest) * chunk - term.sends * send > worth:
            best, worth = term, (term.following - term.longest) * chunk - term.sends * send
    return best


SLOT_ROUNDS = 3
"""Rounds of 33 slot values `_slots_bound` tries, each in the bracket of the last one's best (1/16 as wide)."""


def _slots_bound(P: int, c: int, v: int, S: float, M: float) -> float:
    """A lower bound on the interleaved slot terms Σ_d b_d + (c·v − 1)·B + c·Σ_j (p_j − b_d(j))⁺ of any plan
    whose chunk times add up to at least S and whose largest chunk is at least M (pigeonhole: n identical
    layers in P·v chunks put ⌈n / (P·v)⌉ of them in one). With B fixed, a group of time a whose largest chunk
    is at least m costs at least min over b ∈ [0, B] of b + c·max(a − v·b, m − b, 0); the group holding the
    largest chunk takes a = x ≥ M and m = M, the other P − 1 at least m = a / v and, by convexity, share S − x
    equally. Each term is jointly convex in (x, B), so the least over x (at one of the kinks tried below) is a
    convex, non-increasing D(B), and (c·v − 1)·B + D(B) is convex: its least lies next to the best of a grid,
    which is refined there. On an interval [B_k, B_k+1] it is at least (c·v − 1)·B_k + D(B_k+1), which is what
    is returned. It sees the integrality the mean-based bound misses: 80 blocks in 64 chunks put two blocks
    in one chunk, so every slot or the excess pays for it."""

    def value(B: np.ndarray) -> np.ndarray:
        Bc = B[:, None]
        x = np.stack(np.broadcast_arrays(M, S, v * B, v * M, M + (v - 1) * B, S - (P - 1) * v * B), axis=1)
        x = np.clip(x, M, S)  # the kinks in x of the two groups' terms, and the ends
        m = np.minimum(Bc, np.maximum(x / v, M))
        mine = m + c * np.maximum(np.maximum(x - v * m, M - m), 0.0)
        y = (S - x) / (P - 1)
        others = np.where(Bc >= y / v, y / v, Bc + c * (y - v * Bc))
        return (mine + (P - 1) * others).min(axis=1)

    lo, hi = 0.0, max(S / v, M)  # beyond hi, D is constant and the slope c·v − 1 only adds
    for _ in range(SLOT_ROUNDS):
        B = np.linspace(lo, hi, 33)
        D = value(B)
        k = int(np.argmin((c * v - 1) * B + D))
        floor = float(((c * v - 1) * B[:-1] + D[1:]).min())
        lo, hi = B[max(k - 1, 0)], B[min(k + 1, len(B) - 1)]
    return floor


def least_sends(program: StageProgram, ok: np.ndarray) -> float:
    """Σ o ≥ the stages − 1 cheapest boundaries: each boundary sits on a distinct edge (u, u+1) and costs at least
    that edge's least Rp over allowed pairs."""
    return float(edge_sends(program, ok)[:program.stages - 1].sum()) if program.stages > 1 else 0.0


def least_largest_send(program: StageProgram, ok: np.ndarray) -> float:
    """The largest send of any plan is at least the (S − 1)-th least edge send (S − 1 distinct edges are
    boundaries); 0 for one chunk."""
    least = edge_sends(program, ok)
    S = program.stages
    return float(least[S - 2]) if S > 1 and len(least) >= S - 1 else 0.0


def edge_sends(program: StageProgram, ok: np.ndarray) -> np.ndarray:
    """Every edge's least Rp over allowed pairs, ascending (edges no allowed pair crosses left out): S − 1 of
    them are a plan's boundaries."""
    least = []
    Rp = np.asarray(program.Rp)
    for u, count in zip(*distinct_edges(program.group)):  # one of each kind of edge (the `group` contract)
        pair_ok = ok[u][:, None] & ok[u + 1][None, :]
        value = float(np.where(pair_ok, Rp[u], math.inf).min()) if pair_ok.any() else math.inf
        least += [value] * int(count)
    return np.sort(np.array([x for x in least if math.isfinite(x)]))


def _memory_dual_bound(program: StageProgram, memory: np.ndarray, total_capacity: float, rows: np.ndarray,
                       count: np.ndarray) -> float:
    """Lagrangian bound with the memory of all stages together relaxed.

    Every plan has TPI ≥ Σ_u W[u,k_u] with W = A·(1/v + (c−1/v)/P) + G/P (Σ p ≥ Σ A, max p ≥ Σ p / P over the P
    device groups, max g ≥ Σ g / P), and its strategies satisfy Σ_u M[u,k_u] ≤ P·capacity with M the memory at the least
    in-flight count. Weak duality: for every λ ≥ 0, TPI ≥ Σ_u min_k (W + λ·M)[u,k] − λ·P·capacity; the best λ
    of a log grid (the dual is concave in λ) is kept. `memory` holds the distinct `rows` (`distinct_rows`), each
    standing for `count` layers.
    """
    ok = np.asarray(program.allowed)[rows]
    P, c, v = program.pipeline_degree, program.micro_batches, program.virtual_stages
    # a split backward's TPI is at least c times its v longest chunks (split_backward_tpi): c·Σ p / P
    share = c / P if program.split_schedule is not None else 1 / v + (c - 1 / v) / P
    W = np.where(ok, np.asarray(program.A, dtype=float)[rows] * share
                 + np.asarray(program.G, dtype=float)[rows] / P, math.inf)
    M = np.where(ok, memory, 0.0)
    if not math.isfinite(total_capacity) or not np.any(M > 0):
        return float(W.min(axis=1) @ count)
    mean_memory = float(M.sum(axis=1) @ count) / float(ok.sum(axis=1) @ count)  # over every layer's allowed entries
    scale = float(W.min(axis=1) @ count) / float(count.sum()) / max(mean_memory, 1e-300)
    lam = np.concatenate(([0.0], scale * np.logspace(-4, 4, 49)))[:, None, None]
    return float(((W[None] + lam * M[None]).min(axis=2) @ count - lam[:, 0, 0] * total_capacity).max())
