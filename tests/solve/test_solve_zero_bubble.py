"""Zero-bubble programs (a split backward): the closed form's three facts against torch's operation order, the MILP
against the enumeration oracle, and the device-group bound against the optimum."""

import numpy as np
import pytest
from random_tables import random_program

from uniap.program import StageProgram
from uniap.schedules import ZERO_BUBBLE, _stage_occupancy, simulate_order
from uniap.solve.formulation import Formulation
from uniap.solve.milp import solve
from uniap.solve.program import evaluate, lower_bound, split_send_hops
from uniap.solve.reduce import reduce_program
from uniap.solve.reference import solve_reference
from uniap.solve.split_bound import split_group_bound


def _equal_chunks(P, c, v, F, I, W, send):
    """The event simulation of torch's zero-bubble order over P·v equal chunks."""
    S = P * v
    ran = simulate_order(ZERO_BUBBLE, P, c, v, [F] * S, [I + W] * S, [W] * S, [send] * (S - 1))
    return max(r.end for r in ran)


@pytest.mark.parametrize("P", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_equal_chunks_take_the_steady_state_and_the_bubble_terms(P, v):
    """c·v·(F + I + W) + (P − 1)·max(a·F + b·I + d·W) over `bubble_terms`, for any F, I, W and c = P…3P."""
    rng = np.random.default_rng(P * 10 + v)
    for c in (P, 2 * P, 3 * P):
        for F, I, W in rng.uniform(0.01, 1.0, (4, 3)):
            bubble = max(a * F + b * I + d * W for a, b, d in ZERO_BUBBLE.bubble_terms)
            assert _equal_chunks(P, c, v, F, I, W, 0.0) == pytest.approx(c * v * (F + I + W) + (P - 1) * bubble,
                                                                         rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_sends_below_every_pass_add_at_most_kappa_each(seed):
    """The send term of split_backward_tpi: on equal chunks, sends of ô ≤ min(F, I, W) add at most
    κ·ô = ((S − 1) + 2·(P − 1))·ô (the margin seen over 1,472 cases was one send)."""
    rng = np.random.default_rng(seed)
    for _ in range(25):
        P, v = int(rng.choice([2, 3, 4, 6, 8])), int(rng.integers(1, 5))
        c = P * int(rng.choice([1, 2, 3]))
        F, I, W = rng.uniform(0.01, 1.0, 3)
        send = min(F, I, W) * float(rng.choice([1.0, rng.uniform(0, 1)]))
        program = type("P", (), {"stages": P * v, "pipeline_degree": P})
        added = _equal_chunks(P, c, v, F, I, W, send) - _equal_chunks(P, c, v, F, I, W, 0.0)
        assert added <= split_send_hops(program) * send * (1 + 1e-9)


@pytest.mark.parametrize("P", [2, 3, 5, 8, 16])
def test_every_stage_has_stage_zeros_peaks(P):
    """`same_peaks`: what `held_patterns` reads off stage 0 is what each stage's own order gives."""
    for v in (1, 2, 3, 5):
        for c in (P, 2 * P, 4 * P):
            rounds = ZERO_BUBBLE.bounded_rounds(P, c)
            own = [_stage_occupancy(ZERO_BUBBLE.name, d, P, rounds, v)[0] for d in range(P)]
            assert ZERO_BUBBLE.held_patterns(P, c, v) == [list(map(list, peaks)) for peaks in own]


def _case(seed: int, v: int, chain: bool = False) -> StageProgram:
    """A random zero-bubble program: runs of identical layers (or an embedding, blocks and a head: `chain`),
    layout classes and memory tight enough to bind in some cases."""
    rng = np.random.default_rng(30_000 + seed)
    P = 2
    L = int(rng.integers(P * v + 1, 8)) if v > 1 else int(rng.integers(3, 8))
    K = int(rng.integers(1, 4))
    if chain:
        runs = [1, L - 2, 1]
    else:
        cuts = sorted(rng.choice(np.arange(1, L), size=int(rng.integers(0, 3)), replace=False).tolist())
        runs = np.diff([0, *cuts, L]).tolist()
    memory = float(rng.uniform(20, 60)) if rng.random() < 0.7 else None
    return random_program(seed, layers=L, strategies=K, stages=P, micro_batches=P * int(rng.integers(1, 3)),
                          runs=runs, memory=memory, schedule=ZERO_BUBBLE.name, virtual_stages=v,
                          layouts=sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None)


@pytest.mark.parametrize("v", [1, 2])
@pytest.mark.parametrize("seed", range(16))
def test_zero_bubble_milp_matches_reference(v, seed):
    program = _case(seed, v)
    reference = solve_reference(program)
    for fold in (True, False):
        solution = solve(program, fold=fold)
        if reference is None:
            assert solution is None
            continue
        assert solution is not None and solution.optimal
        assert solution.objective == pytest.approx(reference.objective, rel=1e-6)
        assert solution.objective == pytest.approx(evaluate(program, solution.stage_of, solution.strategy_of))


@pytest.mark.parametrize("v", [1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_zero_bubble_encode_gives_the_evaluated_objective(v, seed):
    """The MILP's objective at a plan's point is the formula's value there, and the cheap bound is below it."""
    program = _case(seed, v)
    form = Formulation(program, reduce_program(program, fold=True))
    rng = np.random.default_rng(seed)
    L, S = program.layers, program.stages
    for _ in range(20):
        cuts = np.sort(rng.choice(np.arange(1, L), size=S - 1, replace=False))
        stage_of = np.searchsorted(cuts, np.arange(L), side="right")
        strategy_of = np.array([rng.choice(np.flatnonzero(program.allowed[u])) for u in range(L)])
        x = form.encode(stage_of, strategy_of)
        value = evaluate(program, stage_of, strategy_of)
        if x is None or not np.isfinite(value):
            continue
        assert float(form.model.cost @ x) * form.scale == pytest.approx(value, rel=1e-9)
        assert lower_bound(program) <= value * (1 + 1e-9)


@pytest.mark.parametrize("v", [1, 2])
@pytest.mark.parametrize("seed", range(16))
def test_device_group_bound_never_exceeds_the_optimum(v, seed):
    """An embedding, identical blocks and a head: the bound by group contents is at most the oracle's optimum
    (inf exactly when nothing fits), at least the floor it is given, and capped at a cut-off."""
    program = _case(seed, v, chain=True)
    reference = solve_reference(program)
    floor = lower_bound(program)
    bound = split_group_bound(program, floor)
    assert bound is not None and bound >= floor
    if reference is None:
        return
    assert bound <= reference.objective * (1 + 1e-9)
    assert split_group_bound(program, floor, cutoff=bound * 0.999) == pytest.approx(bound * 0.999)
