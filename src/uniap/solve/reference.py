"""Exact solver by enumeration, for tiny programs: the oracle the MILP is tested against.

Every placement of P − 1 stage boundaries among the L − 1 gaps, times every assignment of allowed strategies,
is scored by `evaluate_many` (the vectorised `evaluate`), within the search space the MILP has (interleaved:
one strategy per device group on a stretch of identical layers, solve.reduce). Nothing clever, so nothing to get
wrong.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from uniap.errors import UniapError
from uniap.program import StageProgram
from uniap.solve.program import Solution, evaluate_many
from uniap.solve.reduce import one_strategy_groups, reduce_program

MAX_PLANS = 10_000_000
"""Refuse programs with more plans than this (enumeration would take minutes) …"""
MAX_ASSIGNMENTS = 1 << 20
"""… or more strategy assignments than this (they are held in memory at once)."""

_CHUNK = 1 << 15


def solve_reference(program: StageProgram) -> Solution | None:
    """The optimal plan by brute force (None if no plan is feasible); for L ≲ 8, K ≲ 4, P ≤ 3."""
    program.validate()
    start = time.perf_counter()
    L, P = program.layers, program.stages
    choices = [np.flatnonzero(row) for row in np.asarray(program.allowed)]
    assignments = math.prod(len(c) for c in choices)
    placements = math.comb(L - 1, P - 1)
    if assignments * placements > MAX_PLANS or assignments > MAX_ASSIGNMENTS:
        raise UniapError(f"reference solver: {assignments * placements} plans is too many to enumerate")
    if assignments == 0:
        return None
    grid = np.stack(np.meshgrid(*choices, indexing="ij"), axis=-1).reshape(-1, L)
    reduced = reduce_program(program, fold=False)
    best_value, best = math.inf, None
    for cuts in itertools.combinations(range(1, L), P - 1):
        stage_of = np.zeros(L, dtype=int)
        for cut in cuts:
            stage_of[cut:] += 1
        for lo in range(0, len(grid), _CHUNK):
            chunk = grid[lo:lo + _CHUNK]
            values = evaluate_many(program, stage_of, chunk)
            values[~one_strategy_groups(program, reduced, stage_of, chunk)] = math.inf
            i = int(np.argmin(values))
            if values[i] < best_value:
                best_value, best = float(values[i]), (stage_of.copy(), chunk[i].copy())
    if best is None:
        return None
    return Solution(stage_of=best[0], strategy_of=best[1], objective=best_value, optimal=True, gap=0.0,
                    time_s=time.perf_counter() - start, solver="reference")

