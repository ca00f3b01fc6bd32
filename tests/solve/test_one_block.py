"""Chains whose blocks are of several kinds (GPT-OSS's sliding and full attention), bounded by their one-block
relaxation: the device-group bounds on it never exceed the program's own optimum."""

import dataclasses

import numpy as np
import pytest
from random_tables import random_program

from uniap.schedules import ZERO_BUBBLE
from uniap.solve.group_bound import group_bound
from uniap.solve.one_block import one_block_relaxation
from uniap.solve.program import evaluate, lower_bound
from uniap.solve.reduce import reduce_program
from uniap.solve.reference import solve_reference
from uniap.solve.split_bound import split_group_bound


def _case(seed: int, schedule: str):
    """Every layer its own random row (runs of one), on 2–3 device groups of 2–3 chunks, memory binding often."""
    rng = np.random.default_rng(60_000 + seed)
    P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
    L = int(rng.integers(P * v, P * v + 3))
    K = int(rng.integers(1, 4))
    memory = float(rng.uniform(15, 60)) if rng.random() < 0.7 else None
    c = P * int(rng.integers(1, 3))
    return random_program(seed, layers=L, strategies=K, stages=P, micro_batches=c, runs=[1] * L, memory=memory,
                          virtual_stages=v, schedule=schedule,
                          layouts=sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None)


@pytest.mark.parametrize("schedule", ["1f1b", ZERO_BUBBLE.name])
@pytest.mark.parametrize("seed", range(15))
def test_the_relaxations_bound_never_exceeds_the_optimum(schedule, seed):
    """The bound on the relaxation is at most the program's optimum, and the optimum's plan costs no more in the
    relaxation (every entry it takes is at most the program's)."""
    program = _case(seed, schedule)
    relaxed = one_block_relaxation(program)
    assert relaxed is not None
    relaxed.validate()
    if schedule == ZERO_BUBBLE.name:
        bound = split_group_bound(relaxed, lower_bound(relaxed))
    else:
        bound = group_bound(relaxed, reduce_program(relaxed, fold=True))
    assert bound is not None
    if schedule == ZERO_BUBBLE.name:  # the bounds take the relaxation themselves on such a chain
        assert split_group_bound(program, lower_bound(relaxed)) == bound
    else:
        assert group_bound(program, reduce_program(program, fold=True)) == bound
    reference = solve_reference(program)
    if reference is None:
        return
    assert bound <= reference.objective * (1 + 1e-9)
    assert evaluate(relaxed, reference.stage_of, reference.strategy_of) <= reference.objective * (1 + 1e-9)


def _alternating(seed: int, schedule: str):
    """An embedding, blocks of two kinds that alternate (every other block 10 % slower, as GPT-OSS's full
    attention against its sliding window) and a head: each layer its own run."""
    rng = np.random.default_rng(70_000 + seed)
    P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
    L = int(rng.integers(P * v, P * v + 3))
    program = random_program(seed, layers=L, strategies=int(rng.integers(1, 4)), stages=P,
                             micro_batches=P * int(rng.integers(1, 3)), runs=[1, L - 2, 1],
                             memory=float(rng.uniform(15, 60)), virtual_stages=v, schedule=schedule)
    slower = dict(A=np.array(program.A, dtype=float))
    if program.weight_gradient is not None:
        slower["weight_gradient"] = np.array(program.weight_gradient, dtype=float)
    for table in slower.values():
        table[2:L - 1:2] *= 1.1
    return dataclasses.replace(program, group=np.arange(L), **slower)


def test_on_alternating_blocks_the_interleaved_bound_beats_the_cheap_one():
    """On most alternating chains the group bound of the relaxation is above `lower_bound` (the only bound such
    chains had), and on all of them at most the optimum."""
    stronger = feasible = 0
    for seed in range(15):
        program = _alternating(seed, "1f1b")
        relaxed = one_block_relaxation(program)
        bound = group_bound(relaxed, reduce_program(relaxed, fold=True))
        reference = solve_reference(program)
        if reference is None:
            continue
        feasible += 1
        assert bound <= reference.objective * (1 + 1e-9)
        stronger += bound > lower_bound(program) * (1 + 1e-9)
    assert feasible >= 10 and stronger >= feasible - 2


@pytest.mark.parametrize("seed", range(10))
def test_on_alternating_blocks_the_split_bound_stays_below_the_optimum(seed):
    program = _alternating(seed, ZERO_BUBBLE.name)
    relaxed = one_block_relaxation(program)
    reference = solve_reference(program)
    if reference is not None:
        assert split_group_bound(relaxed, lower_bound(program)) <= reference.objective * (1 + 1e-9)


def test_a_chain_of_one_block_kind_is_left_alone():
    program = random_program(0, layers=6, strategies=2, stages=2, runs=[1, 4, 1], virtual_stages=2)
    assert one_block_relaxation(program) is None
