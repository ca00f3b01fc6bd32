"""The search's first incumbents: the uniform and the stagewise guess are real plans, priced by `evaluate`, never
below the optimum, and the stagewise one finds what an even split with one strategy cannot."""

import dataclasses
import math

import numpy as np
import pytest
from random_tables import random_case, random_program

from uniap.solve.guesses import stagewise_guess, uniform_guess
from uniap.solve.program import evaluate
from uniap.solve.reference import solve_reference


def _stage_rule_holds(program, guess) -> bool:
    """Every stage runs one strategy k: each of its layers runs k where allowed, else its fastest allowed one."""
    ok = np.asarray(program.allowed)
    fastest = np.where(ok, np.asarray(program.A, dtype=float), math.inf).argmin(axis=1)
    for i in range(program.stages):
        layers = np.flatnonzero(guess.stage_of == i)
        if not any(all(guess.strategy_of[u] == (k if ok[u, k] else fastest[u]) for u in layers)
                   for k in range(program.strategies)):
            return False
    return True


def _zero_bubble(seed: int):
    rng = np.random.default_rng(seed)
    return random_program(seed, layers=int(rng.integers(3, 7)), strategies=3, stages=2, micro_batches=4,
                          memory=float(rng.uniform(20, 60)), schedule="zero-bubble")


@pytest.mark.parametrize("seed", range(30))
def test_stagewise_guess_is_a_plan_of_its_rule_never_below_the_optimum(seed):
    program = random_case(seed) if seed < 20 else _zero_bubble(seed)
    guess = stagewise_guess(program)
    optimum = solve_reference(program)
    if guess is None:
        return
    assert optimum is not None  # a plan that fits is a plan
    assert guess.objective == evaluate(program, guess.stage_of, guess.strategy_of)
    assert guess.objective >= optimum.objective * (1 - 1e-12)
    assert _stage_rule_holds(program, guess)


def _chain(A, memory=math.inf, Ma=None, micro_batches=4):
    """L layers, K strategies, two 1F1B stages: times A (L, K), no sync, no resharding, no sends; activations
    Ma (L, K) per micro-batch in flight, nothing static."""
    A = np.asarray(A, dtype=float)
    L, K = A.shape
    base = random_program(0, layers=L, strategies=K, stages=2, micro_batches=micro_batches)
    zeros = np.zeros((L, K))
    return dataclasses.replace(base, A=A, G=zeros, Ms=zeros, Ma=zeros if Ma is None else np.asarray(Ma, float),
                               R=np.zeros((L - 1, K, K)), Rp=np.zeros((L - 1, K, K)),
                               allowed=np.ones((L, K), dtype=bool), memory_capacity=memory,
                               group=np.arange(L))


def test_stagewise_balances_a_heavy_head_that_the_even_split_does_not():
    # Three light blocks and a head five times as heavy: the even split puts two blocks with the head (6 per
    # micro-batch on the last stage), the balanced one three blocks before it (5).
    program = _chain([[1.0], [1.0], [1.0], [5.0]])
    guess, uniform = stagewise_guess(program), uniform_guess(program)
    assert list(guess.stage_of) == [0, 0, 0, 1] and list(uniform.stage_of) == [0, 0, 1, 1]
    assert guess.objective < uniform.objective
    assert guess.objective == pytest.approx(solve_reference(program).objective)


def test_stagewise_gives_each_stage_the_fastest_strategy_its_memory_holds():
    # Strategy 0 is fast but keeps 3 bytes per micro-batch; 1F1B with c = 4 holds 2 on the first stage and 1 on
    # the last, so under 4 bytes only the last stage may run it. One strategy for all must take the slow one.
    A = [[1.0, 2.0]] * 4
    program = _chain(A, memory=4.0, Ma=[[1.5, 0.5]] * 4)
    guess, uniform = stagewise_guess(program), uniform_guess(program)
    assert list(guess.strategy_of) == [1, 1, 0, 0]
    assert set(uniform.strategy_of) == {1}
    assert guess.objective < uniform.objective
    assert math.isfinite(evaluate(program, guess.stage_of, guess.strategy_of))


def test_interleaved_programs_get_no_stagewise_guess():
    assert stagewise_guess(random_program(3, layers=6, stages=2, virtual_stages=2)) is None
