"""Plans built by rules, not by the MILP: the search's first incumbents, so that its solves only look for better.

`uniform_guess` is the hand layout of Megatron-LM or torchtitan: an even split by layer count and one strategy for
every layer. `stagewise_guess` keeps one strategy per stage but picks it per stage and balances the split by time:
on GPT-OSS 120B (alternating sliding-window and full-attention layers, so no two neighbours fold into one run
and the MILP places 38 separate layers) its pp8 zero-bubble plan costs 3.025 s, the uniform one 4.06 s, and
HiGHS took six minutes to find 3.030 s.
"""

from __future__ import annotations

import math

import numpy as np

from uniap.program import StageProgram
from uniap.solve.bounds import least_bottleneck
from uniap.solve.program import MEMORY_RTOL, Solution, evaluate_many

BOTTLENECKS_TRIED = 8
"""`stagewise_guess` builds one plan for each of the least feasible bottleneck values, this many, and keeps the
best: the least bottleneck alone can force a worse sync or send than the next one."""


def uniform_guess(program: StageProgram) -> Solution | None:
    """The best hand-style plan of a program: even split by layer count, one strategy for every layer (a layer
    that cannot take it keeps its fastest allowed one). Costs one vectorised evaluate; None if none fits."""
    L, P = program.layers, program.stages
    strategies = _fallbacks(program).T  # (K, L): plan k runs strategy k where it can
    stage_of = np.arange(L) * P // L
    values = evaluate_many(program, stage_of, strategies)
    k = int(np.argmin(values))
    if not math.isfinite(values[k]):
        return None
    return _guess(stage_of, strategies[k], float(values[k]), "uniform")


def stagewise_guess(program: StageProgram) -> Solution | None:
    """A plan of a program without interleaving (v = 1): stage i's layers are a contiguous segment, all under one
    strategy k_i (a layer that cannot take it keeps its fastest allowed one). Per stage and segment the fastest k
    that fits the stage's memory gives its time (layers and resharding); for each of the BOTTLENECKS_TRIED least
    values T that some partition keeps every stage within, a DP finds the partition of least total time within
    T; `evaluate` prices each and the best is kept. O(P·L²·K); None if nothing fits."""
    if program.virtual_stages != 1:
        return None
    L, K, P = program.layers, program.strategies, program.stages
    fallbacks = _fallbacks(program)  # (L, K): what layer u runs when its stage runs k
    u = np.arange(L)[:, None]
    per_layer = {name: np.asarray(getattr(program, name), dtype=float)[u, fallbacks] for name in ("A", "Ms", "Ma")}
    inner = np.zeros((L, K))  # resharding into layer u from u − 1 when both sit on one stage
    inner[1:] = np.asarray(program.R, dtype=float)[u[:-1], fallbacks[:-1], fallbacks[1:]]
    starts = np.minimum(np.arange(L + 1) + 1, L)  # a segment [a, b) reshards into layers a + 1 … b − 1

    def segments(x: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
        """(L+1, L+1, K): Σ x over the layers of segment [a, b) (entries b ≤ a meaningless)."""
        total = np.vstack([np.zeros(K), np.cumsum(x, axis=0)])
        return total[None, :, :] - total[(np.arange(L + 1) if first is None else first)][:, None, :]

    time = segments(per_layer["A"]) + np.maximum(segments(inner, starts), 0.0)
    static, active = segments(per_layer["Ms"]), segments(per_layer["Ma"])
    held = np.asarray(program.inflight, dtype=float) if program.held is None else \
        np.asarray(program.held, dtype=float).max(axis=(1, 2))
    cap = float(program.memory_capacity) * (1 + MEMORY_RTOL)
    ordered = np.triu(np.ones((L + 1, L + 1), dtype=bool), 1)[:, :, None]
    stage_time = np.full((P, L + 1, L + 1), math.inf)
    stage_pick = np.zeros((P, L + 1, L + 1), dtype=int)
    for count in np.unique(held):  # stages holding as many micro-batches share their table
        fits = np.where(ordered & (static + count * active <= cap), time, math.inf)
        stage_pick[held == count], stage_time[held == count] = fits.argmin(axis=2), fits.min(axis=2)

    def partition(T: float) -> list[int]:
        """Stage boundaries of least total time with every stage within T (T at least the least bottleneck)."""
        total = np.full(L + 1, math.inf)
        total[0] = 0.0
        back = []
        for i in range(P):
            step = total[:, None] + np.where(stage_time[i] <= T, stage_time[i], math.inf)
            back.append(step.argmin(axis=0))
            total = step.min(axis=0)
        cuts = [L]
        for i in range(P - 1, -1, -1):
            cuts.append(int(back[i][cuts[-1]]))
        return cuts[::-1]

    values = np.unique(stage_time[np.isfinite(stage_time)])
    least = least_bottleneck(stage_time, values)  # the least bottleneck any partition reaches
    if least == math.inf:
        return None
    best = None
    first = int(np.searchsorted(values, least))
    for T in values[first:first + BOTTLENECKS_TRIED]:
        cuts = partition(T)
        stage_of = np.repeat(np.arange(P), np.diff(cuts))
        strategy_of = np.concatenate([fallbacks[cuts[i]:cuts[i + 1], stage_pick[i, cuts[i], cuts[i + 1]]]
                                      for i in range(P)])
        value = float(evaluate_many(program, stage_of, strategy_of[None, :])[0])
        if math.isfinite(value) and (best is None or value < best.objective):
            best = _guess(stage_of, strategy_of, value, "stagewise")
    return best


def _fallbacks(program: StageProgram) -> np.ndarray:
    """(L, K): the strategy layer u runs when its stage (or the plan) runs k: k where allowed, else the layer's
    fastest allowed one."""
    ok = np.asarray(program.allowed)
    fastest = np.where(ok, np.asarray(program.A, dtype=float), math.inf).argmin(axis=1)
    return np.where(ok, np.arange(program.strategies)[None, :], fastest[:, None])


def _guess(stage_of: np.ndarray, strategy_of: np.ndarray, value: float, rule: str) -> Solution:
    """A guess as a Solution, its `solver` naming the rule that built it."""
    return Solution(stage_of=stage_of, strategy_of=strategy_of, objective=value, optimal=False, gap=math.inf,
                    time_s=0.0, solver=rule)
