"""The solver's formulas against the schedules they price: the time per iteration must bound the event simulation
of each schedule's operation order (report.timeline) from above, on random programs, on random plans and on the
plans the solver returns, and match it within 2 % where the chunks are equal; the memory must equal the largest
activations the operation order holds at once."""

import numpy as np
import pytest
from random_tables import random_program

from uniap.report.timeline import makespan, simulate
from uniap.schedules import RELEASES, VShaped, schedule_named
from uniap.solve.milp import solve
from uniap.solve.program import evaluate, stage_times

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("zero-bubble", 1),
             ("zero-bubble", 2), ("zero-bubble", 3), ("zero-bubble-v", 2), ("dualpipe-v", 2)]


def _simulated(program, schedule, stage_of, strategy_of) -> float:
    times = stage_times(program, stage_of, strategy_of)
    boxes = simulate(schedule, times.chunk_p, times.o, times.g, program.micro_batches, program.virtual_stages,
                     times.chunk_w)
    return makespan(boxes)


def _random_plan(rng, program):
    """Contiguous non-empty chunks cut at random, allowed strategies drawn at random."""
    L, S = program.layers, program.stages
    cuts = np.sort(rng.choice(np.arange(1, L), size=S - 1, replace=False))
    stage_of = np.zeros(L, dtype=int)
    for cut in cuts:
        stage_of[cut:] += 1
    strategy_of = np.array([rng.choice(np.flatnonzero(row)) for row in program.allowed])
    return stage_of, strategy_of


def _program(seed, schedule, v, **kwargs):
    rng = np.random.default_rng(seed)
    P = int(rng.integers(2, 4))
    chosen = schedule_named(schedule)
    c = 2 * P + int(rng.integers(0, P + 1)) if isinstance(chosen, VShaped) \
        else P * int(rng.integers(1, 4)) if chosen.interleaved else int(rng.integers(1, 9))
    layers = P * v + int(rng.integers(0, 5))
    program = random_program(seed, layers=layers, strategies=3, stages=P, micro_batches=c, memory=None,
                             schedule=schedule, virtual_stages=v, **kwargs)
    # sends from negligible to as long as a layer, as real cost tables have them
    scale = float(rng.choice([0.001, 0.01, 0.1, 1.0]))
    return program, type(program)(**{**program.__dict__, "Rp": program.Rp * scale})


@pytest.mark.parametrize("schedule, v", SCHEDULES)
@pytest.mark.parametrize("seed", range(12))
def test_formula_bounds_the_simulation_on_random_plans(schedule, v, seed):
    _, program = _program(seed, schedule, v)
    rng = np.random.default_rng(100 + seed)
    for _ in range(20):
        stage_of, strategy_of = _random_plan(rng, program)
        predicted = evaluate(program, stage_of, strategy_of)
        assert predicted >= _simulated(program, schedule, stage_of, strategy_of) * (1 - 1e-9)


@pytest.mark.parametrize("schedule, v", SCHEDULES)
@pytest.mark.parametrize("seed", range(8))
def test_formula_bounds_the_simulation_on_the_solvers_plans(schedule, v, seed):
    """What an optimiser returns is where a model error would show: the plans the MILP picks."""
    _, program = _program(seed, schedule, v, runs=None)
    solution = solve(program)
    assert solution is not None and solution.optimal
    assert solution.objective >= _simulated(program, schedule, solution.stage_of, solution.strategy_of) * (1 - 1e-9)


def _balanced(schedule, v, P, c, per_chunk, send):
    """P·v equal chunks of `per_chunk` identical layers, sends `send` × a chunk's time."""
    layers = P * v * per_chunk
    program = random_program(0, layers=layers, strategies=1, stages=P, micro_batches=c, memory=None,
                             schedule=schedule, virtual_stages=v)
    weights = None if program.weight_gradient is None else np.full((layers, 1), 0.3)
    program = type(program)(**{**program.__dict__, "A": np.ones((layers, 1)), "G": np.zeros((layers, 1)),
                               "R": np.zeros((layers - 1, 1, 1)), "Rp": np.full((layers - 1, 1, 1), send * per_chunk),
                               "allowed": np.ones((layers, 1), dtype=bool), "weight_gradient": weights})
    return program, np.arange(layers) // per_chunk, np.zeros(layers, dtype=int)


@pytest.mark.parametrize("schedule, v", SCHEDULES)
@pytest.mark.parametrize("P, c", [(2, 4), (4, 8), (4, 16), (8, 16)])  # c = 2P is the least a V runs
@pytest.mark.parametrize("send", [0.0, 0.005, 0.02])
def test_formula_matches_the_simulation_on_equal_chunks(schedule, v, P, c, send):
    program, stage_of, strategy_of = _balanced(schedule, v, P, c, 2, send)
    predicted = evaluate(program, stage_of, strategy_of)
    simulated = _simulated(program, schedule, stage_of, strategy_of)
    assert simulated * (1 - 1e-9) <= predicted <= simulated * 1.02


def test_uneven_chunks_cost_what_the_simulation_says_at_least():
    """The issue's case: the same stage sums, chunks embedding + 3 | 1 | 1 | 3 + head (here 4, 1, 1, 4 layers)."""
    program = random_program(0, layers=10, strategies=1, stages=2, micro_batches=4, memory=None, virtual_stages=2)
    program = type(program)(**{**program.__dict__, "A": np.ones((10, 1)), "G": np.zeros((10, 1)),
                               "R": np.zeros((9, 1, 1)), "Rp": np.zeros((9, 1, 1)),
                               "allowed": np.ones((10, 1), dtype=bool), "group": np.zeros(10, dtype=int)})
    even = np.repeat(np.arange(4), [3, 2, 2, 3])
    uneven = np.repeat(np.arange(4), [4, 1, 1, 4])
    strategy_of = np.zeros(10, dtype=int)
    ratio_simulated = (_simulated(program, "interleaved-1f1b", uneven, strategy_of)
                       / _simulated(program, "interleaved-1f1b", even, strategy_of))
    ratio_predicted = evaluate(program, uneven, strategy_of) / evaluate(program, even, strategy_of)
    assert ratio_simulated > 1.05  # the uneven chunks wait on each other
    assert ratio_predicted >= ratio_simulated * 0.98


def _walked_peak(program, schedule, stage_of, strategy_of) -> np.ndarray:
    """Per device group: static bytes plus the most activation bytes its operation order holds at once (a
    forward keeps its chunk's activations until that micro-batch's backward, or its weight pass when split)."""
    P, v, c = program.pipeline_degree, program.virtual_stages, program.micro_batches
    layer = np.arange(program.layers)
    static = np.bincount(stage_of, weights=program.Ms[layer, strategy_of], minlength=program.stages)
    per_chunk = np.bincount(stage_of, weights=program.Ma[layer, strategy_of], minlength=program.stages)
    peaks = np.zeros(P)
    for d in range(P):
        chosen = schedule_named(schedule)
        held, most = 0.0, 0.0
        for kind, chunk, _ in chosen.order(d, P, c, v):
            if kind not in ("F", *RELEASES):
                continue
            held += per_chunk[chunk] if kind == "F" else -per_chunk[chunk]
            most = max(most, held)
        peaks[d] = static[program.group_chunks[d]].sum() + most
    return peaks


@pytest.mark.parametrize("schedule, v", SCHEDULES)
@pytest.mark.parametrize("seed", range(10))
def test_memory_is_the_peak_the_operation_order_holds(schedule, v, seed):
    """Uneven chunks included: a first chunk much larger than the last one is what one count per chunk missed."""
    _, program = _program(seed, schedule, v)
    rng = np.random.default_rng(200 + seed)
    program = type(program)(**{**program.__dict__, "Ma": program.Ma * rng.uniform(0.1, 10, program.Ma.shape)})
    for _ in range(10):
        stage_of, strategy_of = _random_plan(rng, program)
        memory = stage_times(program, stage_of, strategy_of).memory
        np.testing.assert_allclose(memory, _walked_peak(program, schedule, stage_of, strategy_of), rtol=1e-9)
