"""The dynamic-programming bound on interleaved programs (solve/group_bound.py): never above the optimum the
enumeration oracle finds, infinite only when nothing fits, and as strong as the device-group MILP on real tables."""

import math

import numpy as np
import pytest
from random_tables import model_chain, random_program

import uniap.solve.group_bound as module
from uniap.planner import Candidate, build_candidate
from uniap.solve.backends import HighsBackend
from uniap.solve.formulation import scale_of
from uniap.solve.group_bound import group_bound
from uniap.solve.group_relaxation import GroupRelaxation, chain_plan
from uniap.solve.milp import solve, solve_outcome
from uniap.solve.one_block import one_block_relaxation
from uniap.solve.reduce import reduce_program
from uniap.solve.reference import solve_reference
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.workload import Workload


def _case(seed: int):
    """An embedding, a run of identical blocks and a head, on 2–3 device groups of 2–3 chunks."""
    rng = np.random.default_rng(50_000 + seed)
    P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
    L = int(rng.integers(P * v, P * v + 3))
    K = int(rng.integers(1, 4))
    memory = float(rng.uniform(15, 60)) if rng.random() < 0.7 else None
    return random_program(seed, layers=L, strategies=K, stages=P, micro_batches=P * int(rng.integers(1, 4)),
                          runs=[1, L - 2, 1], memory=memory, virtual_stages=v,
                          layouts=sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None)


@pytest.mark.parametrize("seed", range(45))
def test_bound_never_exceeds_the_optimum(seed):
    program = _case(seed)
    reduced = reduce_program(program, fold=True)
    bound = group_bound(program, reduced)
    assert bound is not None
    reference = solve_reference(program)
    if reference is None:
        return  # nothing fits (the bound may or may not see it)
    assert bound <= reference.objective * (1 + 1e-9)
    # With a cut-off it is still a bound, and it reaches the cut-off only when the optimum does.
    for cutoff in (reference.objective * 0.9, reference.objective * 1.1):
        capped = group_bound(program, reduced, cutoff)
        assert capped <= reference.objective * (1 + 1e-9)
        assert (capped >= cutoff) <= (reference.objective >= cutoff)


def test_memory_forces_the_largest_chunk(monkeypatch):
    """Where a group's contents fit its memory only with many blocks in its chunks that hold few micro-batches,
    its largest chunk is at least what that cut forces (group_bound's bisection over κ): never above the
    oracle's optimum, never below the bound that lets memory and time each take their best cut, and above it
    on some tight-memory chains."""
    least_held = module._least_held

    def uncapped(held, n, caps, end_cap, end_chunk, empty):  # the old rule: memory at the least-held cut, whatever κ
        return least_held(held, n, n + 1e9, n + 1e9, end_chunk, empty)

    programs = [model_chain(seed, 70_000, (15, 45), extra_layers=5, rounds=4) for seed in range(60)]
    assert _tighter_than(monkeypatch, programs, "_least_held", uncapped) >= 2  # 3 of the 50 that fit


def _tighter_than(monkeypatch, programs, attribute: str, weaker) -> int:
    """How many of `programs` (those with a plan) the group bound puts above the same bound with `attribute` of
    solve.group_bound replaced by `weaker`; on every one, both are at most the oracle's optimum and the weaker is
    never above."""
    tighter = 0
    for program in programs:
        reduced = reduce_program(program, fold=True)
        strong = group_bound(program, reduced)
        with monkeypatch.context() as patch:
            patch.setattr(module, attribute, weaker)
            weak = group_bound(program, reduced)
        reference = solve_reference(program)
        if reference is None:
            continue
        assert weak <= strong * (1 + 1e-12) and strong <= reference.objective * (1 + 1e-9)
        tighter += strong > weak * (1 + 1e-6)
    return tighter


@pytest.mark.parametrize("seed", range(45))
def test_infinite_only_when_nothing_fits(seed):
    program = _case(seed)
    if group_bound(program, reduce_program(program, fold=True)) == math.inf:
        assert solve_reference(program) is None


def test_other_chains_are_bounded_on_their_one_block_relaxation_and_left_to_the_milp():
    """Runs of 2, 4 and 2 layers: the bound is the one-block relaxation's (solve.one_block), at most the optimum,
    and no contents come back (the relaxation's are not the program's): plans are left to the MILPs."""
    program = random_program(1, layers=8, strategies=2, stages=2, runs=[2, 4, 2], virtual_stages=2)
    relaxed = one_block_relaxation(program)
    bound = group_bound(program, reduce_program(program, fold=True))
    assert bound == group_bound(relaxed, reduce_program(relaxed, fold=True))
    assert bound <= solve_reference(program).objective * (1 + 1e-9)
    assert group_bound(program, reduce_program(program, fold=True), contents=True) == (bound, None)


@pytest.mark.parametrize("candidate", [(4, 16, 2), (4, 32, 3), (8, 32, 2)])
def test_real_tables_between_the_relaxation_and_the_optimum(candidate):
    """llama2-7b on 32 A100s: the bound is at most the proven optimum and about as strong as the coarse
    device-group MILP (it counts the largest chunk exactly, but the gradient sync's max only by ω)."""
    seq = 4096
    program = build_candidate(Candidate(*candidate, "interleaved-1f1b"), model=load_model("llama2-7b", seq),
                              cluster=load_cluster("a100-80g:4x8"), workload=Workload(128, seq, "bf16"), max_tp=None)
    reduced = reduce_program(program, fold=True)
    bound = group_bound(program, reduced)
    optimum = solve(program)
    assert optimum is not None and optimum.optimal
    assert bound <= optimum.objective * (1 + 1e-9)
    scale = scale_of(program, reduced)
    relaxation = GroupRelaxation(program, reduced, scale, edges=False)
    coarse = HighsBackend(relaxation.model).solve(None, None, 0.0).bound * scale
    assert bound >= coarse * (1 - 1e-3)


@pytest.mark.parametrize("v", [2, 3, 5])
def test_end_group_largest_chunk_by_enumeration(v):
    """The closed form of the least largest chunk of the group holding the embedding (or head) equals trying
    every split: m blocks beside the end layer, the rest over the other v − 1 chunks, each at least one."""
    from uniap.solve.group_bound import _end_group_largest

    rng = np.random.default_rng(v)
    t, x = rng.uniform(0, 3, 4), np.concatenate([[0.0], rng.uniform(0, 10, 3)])
    n = np.arange(v - 1, 20, dtype=float)
    got = _end_group_largest(t, x, n, v)
    for i, ti in enumerate(t):
        for j, xj in enumerate(x):
            for k, nk in enumerate(n.astype(int)):
                splits = [max(xj + m * ti, math.ceil((nk - m) / (v - 1)) * ti) for m in range(nk - (v - 1) + 1)]
                assert got[i, j, k] == pytest.approx(min(splits))


def test_contents_where_the_bound_is_least_and_the_plan_that_attains_it():
    """`contents=True` gives the group contents of the DP's least point: every run placed whole, the ends on
    their groups. A plan holding them is never below the bound, and where it reaches the bound it is the
    optimum; the UOP's first step then settles the candidate as optimal without a MILP. Where an end layer
    reshards from its group's blocks (which the bound does not price) the contents still come back, and a plan
    holding them pays that resharding: half the cases here have no resharding at the chain's ends, as when the
    embedding and head share the blocks' layout."""
    attained = 0
    for seed in range(45):
        program = _case(seed)
        if seed % 2:
            program.R[[0, -1]] = 0.0
        reduced = reduce_program(program, fold=True)
        bound, counts = group_bound(program, reduced, contents=True)
        reference = solve_reference(program)
        if counts is None or reference is None:
            assert reference is None or bound == np.inf
            continue
        P = program.pipeline_degree
        assert [int(held.sum()) for held in counts] == [run.length for run in reduced.runs]
        assert counts[0][0].sum() == 1 and counts[2][P - 1].sum() == 1
        plan, value = chain_plan(program, reduced, counts)
        assert value >= bound * (1 - 1e-9)
        if value <= bound * (1 + 1e-6):
            attained += 1
            assert value == pytest.approx(reference.objective, rel=1e-6)
            outcome = solve_outcome(program, cutoff=reference.objective * 1.5, phase="bound")
            assert outcome.status == "optimal"
            assert outcome.solution.objective == pytest.approx(reference.objective, rel=1e-6)
    assert attained >= 2


def _several_blocks_per_chunk(seed: int):
    """An embedding, 1–3 chunks' worth of blocks beyond one per chunk, and a head, on 2 device groups."""
    rng = np.random.default_rng(90_000 + seed)
    P, v = [(2, 2), (2, 3)][seed % 2]
    L = 2 + P * v + int(rng.integers(1, 4))
    memory = float(rng.uniform(15, 45)) if rng.random() < 0.6 else None
    return random_program(seed, layers=L, strategies=2, stages=P, micro_batches=P * int(rng.integers(1, 3)),
                          runs=[1, L - 2, 1], memory=memory, virtual_stages=v)


def test_whole_blocks_count_the_chunks_over_the_slot(monkeypatch):
    """With more blocks than chunks, every cut of a group has at least its most even cut's excess over a slot
    (`_slot_values`): the bound stays below the oracle's optimum, is never below the bound that counts the
    largest chunk's excess alone, and is above it on some chains."""
    most_even = module._most_even

    def one_largest(t, x, blocks, v):  # the same largest chunk, but only it over the slot
        levels, counts = most_even(t, x, blocks, v)
        largest = np.where(counts > 0, levels, -np.inf).max(axis=0)
        none = np.zeros_like(largest)
        return np.stack([largest, none, none]), np.stack([np.ones_like(largest), none, none])

    programs = [_several_blocks_per_chunk(seed) for seed in range(40)]
    assert _tighter_than(monkeypatch, programs, "_most_even", one_largest) >= 3  # 12 of the 32 that fit


def test_the_largest_sync_is_priced_as_itself(monkeypatch):
    """The sync enters as max_d g_d, searched over its values (`_capped_sync`), where weights ω see a weighted
    mean: never above the oracle's optimum, never below the bound with the weights alone, and above it on some
    chains."""
    def weights_only(slots, value, slope, windows, P, v, pricing, blocks, known):
        return known, None

    programs = [_several_blocks_per_chunk(seed) for seed in range(40)]
    assert _tighter_than(monkeypatch, programs, "_capped_sync", weights_only) >= 3  # 17 of the 32 that fit


@pytest.mark.parametrize("seed", range(10))
def test_most_even_cut(seed):
    """Of every cut of n identical blocks (and an end layer in the first chunk) into v chunks, the greedy one
    (`_most_even`: its chunk times and how many chunks take each) is a cut, has the least largest chunk, and has
    the least Σ (l − b)⁺ at every slot b."""
    from itertools import product

    from uniap.solve.group_bound import _most_even

    rng = np.random.default_rng(95_000 + seed)
    v, blocks = int(rng.integers(2, 5)), int(rng.integers(3, 9))
    t, x = rng.uniform(0.5, 2.0, 2), rng.uniform(0.0, 3.0, 2)
    x[0] = 2 * t[0]  # an end layer of whole blocks: it takes its block level before the others
    levels, counts = _most_even(t, x if seed % 2 else None, blocks, v)
    for k, e, n in product(range(2), range(levels.shape[2]), range(blocks + 1)):
        end = x[e] if seed % 2 else 0.0
        level, count = levels[:, k, e, n], counts[:, k, e, n]
        assert count.sum() == v and count.min() >= 0
        assert (level * count).sum() == pytest.approx(n * t[k] + end)
        cuts = np.array([cut for cut in product(range(n + 1), repeat=v) if sum(cut) == n], dtype=float)
        times = cuts * t[k]
        times[:, 0] += end
        tops = times.max(axis=1)
        assert level[count > 0].max() == pytest.approx(tops.min())
        for b in np.linspace(0.0, tops.max(), 9):
            least = np.maximum(times - b, 0.0).sum(axis=1).min()
            assert (count * np.maximum(level - b, 0.0)).sum() <= least * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("seed", range(20))
def test_the_slot_search_is_exact_unless_a_probe_beats_what_the_caller_has(seed):
    """`_least_over_slots` on a random slope·B + D(B), D non-increasing: exact without a bound to beat; with one
    (`beat`), exact where the minimum is at least it, and below it where the minimum is, from any `near` slot."""
    rng = np.random.default_rng(seed)
    slots = np.unique(np.concatenate([[0.0], rng.uniform(0, 10, 400)]))
    D = np.sort(rng.uniform(0, 50, len(slots)))[::-1]
    slope = rng.uniform(0.5, 5)

    def value(B):
        return slope * B + D[np.searchsorted(slots, B)]

    least = float(value(slots).min())
    assert module._least_over_slots(slots, value, slope, None)[0] == pytest.approx(least)
    near = float(slots[rng.integers(len(slots))])
    above = module._least_over_slots(slots, value, slope, None, least - 1.0, near)
    assert above[0] == pytest.approx(least)
    below = module._least_over_slots(slots, value, slope, None, least + 1.0, near)
    assert below[0] < least + 1.0


def _ends_and_many_blocks(seed: int):
    """An embedding, one or two blocks per chunk (and up to P − 1 more), and a head, on 3–4 groups of 2–3 chunks."""
    rng = np.random.default_rng(70_000 + seed)
    P, v = [(3, 2), (4, 2), (3, 3), (4, 3)][seed % 4]
    L = 2 + P * v * int(rng.integers(1, 3)) + int(rng.integers(0, P))
    memory = float(rng.uniform(15, 60)) if rng.random() < 0.5 else None
    return random_program(seed, layers=L, strategies=3, stages=P, micro_batches=P * int(rng.integers(1, 3)),
                          runs=[1, L - 2, 1], memory=memory, virtual_stages=v)


def test_each_group_cuts_its_contents_its_own_way():
    """`chain_plan` lets each group choose its cut, and its end layer's strategy: its plan is never worse than the
    best one whose groups all cut the given contents one way, better on some chains (16 of these 60), and never
    below the group bound. On some (14) its plan runs an end layer under a lighter strategy than the contents'
    (the bound prices a group's bytes at one moment of the schedule; a cut must fit at every moment)."""
    from uniap.solve.group_relaxation import _assemble, _group_cuts
    from uniap.solve.program import evaluate

    better = lighter = 0
    for seed in range(60):
        program = _ends_and_many_blocks(seed)
        reduced = reduce_program(program, fold=True)
        bound, counts = group_bound(program, reduced, contents=True)
        if counts is None:
            continue
        cuts = [_group_cuts(program, reduced, counts, d) for d in range(program.pipeline_degree)]
        plans = [_assemble(program, reduced, [group[w] for group in cuts]) for w in range(len(cuts[0]))]
        uniform = min([evaluate(program, *plan) for plan in plans if plan is not None], default=math.inf)
        plan, value = chain_plan(program, reduced, counts)
        assert value <= uniform
        assert value >= bound * (1 - 1e-9)
        if plan is not None:
            assert evaluate(program, *plan) == value
            ends = [(0, 0, 0), (len(reduced.runs) - 1, program.pipeline_degree - 1, program.layers - 1)]
            given = [reduced.runs[r].keep[int(np.argmax(counts[r][d]))] for r, d, _ in ends]
            lighter += any(plan[1][u] != k for (_, _, u), k in zip(ends, given))
        better += value < uniform * (1 - 1e-9)
    assert better >= 5 and lighter >= 3


def test_an_end_layer_is_priced_with_its_own_bytes():
    """The bound takes each strategy of the embedding and the head with its own bytes: never below the bound that
    gives every one of them the least bytes of any (as it did until 8 December, when the fastest embedding of
    Megatron's 530B fitted a first group that no plan fits), and above it on some chains (6 of these 60)."""
    import dataclasses

    def least_end_bytes(program):
        ok = np.asarray(program.allowed)
        tables = {}
        for name in ("Ms", "Ma"):
            table = np.array(getattr(program, name), dtype=float)
            for u in (0, program.layers - 1):
                table[u] = np.where(ok[u], table[u][ok[u]].min(), table[u])
            tables[name] = table
        return dataclasses.replace(program, **tables)

    higher = 0
    for seed in range(60):
        program = _ends_and_many_blocks(seed)
        bound = group_bound(program, reduce_program(program, fold=True))
        lighter = least_end_bytes(program)
        least = group_bound(lighter, reduce_program(lighter, fold=True))
        assert bound >= least * (1 - 1e-9)
        higher += bound > least * (1 + 1e-9)
    assert higher >= 3
