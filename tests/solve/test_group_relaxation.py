"""The device-group relaxations of interleaved programs: valid bounds (against the enumeration oracle), the chain
ends' resharding, the direct construction, and that solving through them gives the chunk MILP's optimum on real
cost tables."""

import dataclasses
import math

import numpy as np
import pytest
from random_tables import model_chain, random_program

import uniap.solve.milp as milp
from uniap.planner import Candidate, build_candidate
from uniap.solve.backends import HighsBackend
from uniap.solve.formulation import scale_of
from uniap.solve.group_relaxation import GroupRelaxation, chain_plan
from uniap.solve.program import evaluate
from uniap.solve.reduce import reduce_program
from uniap.solve.reference import solve_reference
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload


def _case(seed: int):
    rng = np.random.default_rng(30_000 + seed)
    P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
    L = int(rng.integers(P * v, P * v + 3))
    K = int(rng.integers(1, 4))
    cuts = sorted(rng.choice(np.arange(1, L), size=int(rng.integers(0, 3)), replace=False).tolist())
    memory = float(rng.uniform(20, 60)) if rng.random() < 0.7 else None
    return random_program(seed, layers=L, strategies=K, stages=P, micro_batches=P * int(rng.integers(1, 3)),
                          runs=np.diff([0, *cuts, L]).tolist(), memory=memory, virtual_stages=v,
                          layouts=sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None)


def _relax(program, edges: bool):
    reduced = reduce_program(program, fold=True)
    scale = scale_of(program, reduced)
    relaxation = GroupRelaxation(program, reduced, scale, edges)
    result = HighsBackend(relaxation.model).solve(None, None, 0.0)
    return reduced, relaxation, result, scale


@pytest.mark.parametrize("seed", range(30))
def test_relaxations_bound_the_optimum_and_edges_tighten(seed):
    program = _case(seed)
    reference = solve_reference(program)
    bounds = {}
    for edges in (False, True):
        _, _, result, scale = _relax(program, edges)
        bounds[edges] = result.bound * scale if result.status == "optimal" else np.inf
    if reference is None:
        return
    assert bounds[False] <= reference.objective * (1 + 1e-7)
    assert bounds[True] <= reference.objective * (1 + 1e-7)
    assert bounds[True] >= bounds[False] * (1 - 1e-7)


def test_memory_rows_price_the_chunks_in_flight_counts():
    """A group's memory rows charge its layers the micro-batches of the chunks they must spread over (every chunk
    holds at least N − (v − 1)·κ of a run), not the least in-flight count of any chunk for all of them: against
    the enumeration oracle both bounds hold, the charged one is never weaker, and on some tight-memory chains it
    is stronger (the least count let a group's contents fit that no cut into chunks fits)."""
    tighter = 0
    for seed in range(40):
        rng = np.random.default_rng(50_000 + seed)
        P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
        L = P * v + int(rng.integers(0, 4))
        program = random_program(seed, layers=L, strategies=3, stages=P, micro_batches=P * int(rng.integers(1, 3)),
                                 runs=[1, L - 2, 1], memory=float(rng.uniform(20, 50)), virtual_stages=v)
        reference = solve_reference(program)
        inflight = np.asarray(program.inflight, dtype=float).copy()
        for chunks in program.group_chunks:  # every chunk of a group at the group's least count: the old rows
            inflight[chunks] = inflight[chunks].min()
        bounds = {}
        for charged, relaxed in ((True, program), (False, dataclasses.replace(program, inflight=inflight))):
            _, _, result, scale = _relax(relaxed, edges=False)
            bounds[charged] = result.bound * scale if result.status == "optimal" else np.inf
        if reference is None:
            continue
        assert bounds[True] <= reference.objective * (1 + 1e-7)
        assert bounds[True] >= bounds[False] * (1 - 1e-7)
        tighter += bounds[True] > bounds[False] * (1 + 1e-6)
    assert tighter >= 2  # 2 of the 40


def test_the_coarse_bound_prices_resharding_at_the_chain_ends():
    """Chains shaped like a model (a first layer, a run of identical blocks, a last layer; two layout classes):
    the coarse relaxation, which prices the resharding at the chain's ends, still bounds the optimum, is never
    below its bound on the same chain without that resharding, and is tighter on some."""
    tighter = 0
    for seed in range(40):
        program = model_chain(seed, 40_000, (30, 80), layouts=[0, 0, 1] if seed % 2 else [0, 1, 1])
        reference = solve_reference(program)
        _, _, with_ends, scale = _relax(program, edges=False)
        _, _, without, _ = _relax(_without_end_resharding(program), edges=False)
        if reference is None or with_ends.status != "optimal":
            continue
        assert with_ends.bound * scale <= reference.objective * (1 + 1e-7)
        assert with_ends.bound >= without.bound * (1 - 1e-7)
        tighter += with_ends.bound > without.bound * (1 + 1e-6)
    assert tighter >= 5


def _without_end_resharding(program):
    """The same program with no resharding on its first and last edges (its ends' layouts all alike)."""
    R = np.array(program.R, dtype=float)
    R[[0, -1]] = 0.0
    return dataclasses.replace(program, R=R)


@pytest.mark.parametrize("seed", range(30))
def test_chain_plan_holds_the_contents_it_is_given(seed):
    program = _case(seed)
    reduced, relaxation, result, _ = _relax(program, edges=True)
    if result.status != "optimal":
        return
    contents = relaxation.contents(result.x)
    plan, value = chain_plan(program, reduced, contents)
    if plan is None:
        return
    stage_of, strategy_of = plan
    assert value == evaluate(program, stage_of, strategy_of)
    P = program.pipeline_degree
    assert np.all(np.diff(stage_of) >= 0) and np.all(np.diff(stage_of) <= 1)
    assert stage_of[0] == 0 and stage_of[-1] == program.stages - 1
    for run, held in zip(reduced.runs, contents):
        span = slice(run.first, run.last + 1)
        for d in range(P):
            mine = strategy_of[span][stage_of[span] % P == d]
            assert sorted(mine.tolist()) == sorted(np.repeat(run.keep, held[d]).tolist())
    assert evaluate(program, stage_of, strategy_of) >= result.bound * relaxation.scale * (1 - 1e-7)


@pytest.mark.parametrize("candidate, attained", [((2, 8, 2), True), ((2, 8, 3), False), ((4, 8, 2), True)])
def test_solving_by_group_gives_the_chunk_milp_optimum(candidate, attained, monkeypatch):
    """On real tables (gpt2, 8 A100) the by-group solve proves the optimum the chunk MILP alone proves. Where the
    relaxation is attained no chunk MILP runs; with v = 3 it is not: gpt2's head takes 3.4 blocks, so the best
    plan gives it a chunk of its own, which the group's counts do not see."""
    model, cluster, workload = load_model("gpt2", 1024), load_cluster("a100-80g:1x8"), Workload(32, 1024, "bf16")
    program = build_candidate(Candidate(*candidate, "interleaved-1f1b"), model, cluster, workload, None)
    chunk_milps = []
    original = milp.Formulation
    monkeypatch.setattr(milp, "Formulation", lambda *a: chunk_milps.append(1) or original(*a))
    by_group = milp.solve(program)
    assert by_group is not None and by_group.optimal and (not chunk_milps) == attained
    monkeypatch.setattr(milp, "_by_group", lambda *a: ("optimal", -np.inf, None, None))
    alone = milp.solve(program)
    assert alone.optimal and by_group.objective == pytest.approx(alone.objective, rel=1e-6)


def test_a_deferred_step_hands_its_direct_plan_to_the_search():
    """Where the device-group MILPs leave a candidate to its chunk MILP, the best direct plan of their contents
    comes back with the deferral (a valid plan, priced exactly, not claimed optimal), and the UOP takes it as
    its incumbent, so the candidates after it are cut off against a plan instead of nothing."""
    from uniap.solve.uop import _State

    model, cluster, workload = load_model("gpt2", 1024), load_cluster("a100-80g:1x8"), Workload(32, 1024, "bf16")
    program = build_candidate(Candidate(2, 8, 3, "interleaved-1f1b"), model, cluster, workload, None)
    best = milp.solve(program)
    cutoff = best.objective * 1.5
    outcome = milp.solve_outcome(program, cutoff=cutoff, phase="relaxation")
    found = outcome.solution
    assert outcome.status == "deferred" and found is not None and not found.optimal
    assert found.objective == pytest.approx(evaluate(program, found.stage_of, found.strategy_of), rel=1e-12)
    assert outcome.bound <= best.objective * (1 + 1e-9) <= found.objective * (1 + 1e-9) and found.objective < cutoff
    state, queue = _State(["candidate"], {}, None), []
    assert state.defer(queue, (0, 0.0, 0), outcome, 0.1)
    assert state.best is found and state.cutoff() == found.objective and queue == [(0, outcome.bound, 0)]  # the chunk MILP keeps its tier


@pytest.mark.parametrize("seed", range(30))
def test_memory_rows_bound_chains_with_several_blocks_per_chunk(seed):
    """Chains shaped like a model with up to three blocks per chunk and tight memory, where a chunk's cap κ and
    the chain ends' chunks decide what fits (`add_memory_constraint`'s rows for each price λ, and the end
    layer's chunk holding m of the run's layers): both relaxations still bound the enumeration oracle's optimum,
    and a direct plan with their contents costs at least the bound."""
    rng = np.random.default_rng(70_000 + seed)
    P, v = [(2, 2), (2, 3)][seed % 2]
    L = 2 + P * v + int(rng.integers(1, 4))  # 1 to 3 chunks of two blocks or more
    program = random_program(seed, layers=L, strategies=2, stages=P, micro_batches=P * int(rng.integers(1, 3)),
                             runs=[1, L - 2, 1], memory=float(rng.uniform(15, 45)), virtual_stages=v)
    reference = solve_reference(program)
    for edges in (False, True):
        reduced, relaxation, result, scale = _relax(program, edges)
        if result.status != "optimal":
            assert reference is None
            continue
        if reference is not None:
            assert result.bound * scale <= reference.objective * (1 + 1e-7)
        plan, value = chain_plan(program, reduced, relaxation.contents(result.x))
        assert value >= result.bound * scale * (1 - 1e-7)


@pytest.mark.parametrize("seed", range(20))
def test_least_held_order_lowers_the_peak(seed):
    """The memory cut's arrangement keeps every chunk's kind and length multiset, never raises the activation
    peak, and with one moment (one row of in-flight counts) reaches the least peak of any arrangement."""
    from itertools import permutations

    from uniap.solve.group_relaxation import _least_held_order

    rng = np.random.default_rng(80_000 + seed)
    v = int(rng.integers(2, 6))
    block, end = (0, 0, 1), (1, 0, 0)
    pieces = [[block] * int(rng.integers(1, 4)) for _ in range(v)]
    pieces[0] = [end] + pieces[0] if seed % 2 else pieces[0]
    Ma = {block: 1.0, end: 2.5}
    moments = 1 if seed < 10 else int(rng.integers(2, 5))
    patterns = rng.integers(1, 9, size=(moments, v)).astype(float)

    def peak(chunks):
        return float((patterns @ np.array([sum(Ma[label] for label in piece) for piece in chunks])).max())

    out = _least_held_order(pieces, patterns, Ma)
    assert [piece[0] == end for piece in out] == [piece[0] == end for piece in pieces]
    assert sorted(map(len, out)) == sorted(map(len, pieces))
    assert peak(out) <= peak(pieces)
    if moments == 1:
        movable = [k for k, piece in enumerate(pieces) if all(label == block for label in piece)]
        best = math.inf
        for order in permutations([len(pieces[k]) for k in movable]):
            trial = list(pieces)
            for k, n in zip(movable, order):
                trial[k] = [block] * n
            best = min(best, peak(trial))
        assert peak(out) == pytest.approx(best)
