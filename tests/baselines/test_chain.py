"""The DPs inside the baselines against brute force on small random instances."""

import itertools
import math

import numpy as np
import pytest

from uniap.baselines.alpa import inter_op
from uniap.baselines.chain import ChainDP, layout_classes, memory_bins
from uniap.baselines.galvatron import balanced_split


def _instance(rng, L, K, classes):
    cls = rng.integers(0, classes, size=K)
    cost = rng.uniform(1, 10, size=(L, K))
    cost[rng.random((L, K)) < 0.15] = math.inf  # some strategies not allowed
    base = rng.uniform(0, 5, size=(L - 1, classes, classes))
    base[:, np.arange(classes), np.arange(classes)] = 0.0
    trans = base[:, cls][:, :, cls]  # equal rows/columns within a class, as in the real cost model
    mem = rng.integers(1, 6, size=(L, K)).astype(float)  # whole bins: no rounding
    return cost, trans, mem


def _brute(cost, trans, mem, capacity, first, last):
    K = cost.shape[1]
    best, arg = math.inf, None
    for combo in itertools.product(range(K), repeat=last - first + 1):
        us = range(first, last + 1)
        if sum(mem[u, k] for u, k in zip(us, combo)) > capacity:
            continue
        value = sum(cost[u, k] for u, k in zip(us, combo))
        value += sum(trans[u, combo[i], combo[i + 1]] for i, u in enumerate(range(first, last)))
        if value < best:
            best, arg = value, combo
    return best, arg


@pytest.mark.parametrize("seed", range(8))
def test_chain_dp_is_exact_on_whole_bins(seed):
    rng = np.random.default_rng(seed)
    L, K = 5, 4
    cost, trans, mem = _instance(rng, L, K, classes=2)
    capacity = float(rng.integers(6, 16))
    dp = ChainDP(cost, trans, mem, capacity, bins=int(capacity))
    value, chosen = dp.best(0, L - 1)
    expect, _ = _brute(cost, trans, mem, capacity, 0, L - 1)
    if math.isinf(expect):
        assert chosen is None
        return
    assert value == pytest.approx(expect)
    # the returned assignment really has that value and fits
    total = sum(cost[u, k] for u, k in enumerate(chosen)) + sum(trans[u, chosen[u], chosen[u + 1]]
                                                                 for u in range(L - 1))
    assert total == pytest.approx(value)
    assert sum(mem[u, k] for u, k in enumerate(chosen)) <= capacity
    # every range at once agrees with the one-range DP and brute force
    table = dp.range_costs()
    for a in range(L):
        for b in range(a, L):
            want, _ = _brute(cost, trans, mem, capacity, a, b)
            assert table[a, b] == pytest.approx(want) if math.isfinite(want) else math.isinf(table[a, b])
    assert np.all(np.isinf(table[np.tril_indices(L, -1)]))


def test_memory_rounds_up_so_plans_fit():
    w = memory_bins(np.array([[0.0, 0.26, 1.0, 5.0]]), capacity=1.0, bins=4)
    assert w.tolist() == [[0, 2, 4, 5]]  # 5.0 cannot fit at all: bins + 1


def test_layout_classes_group_equal_rows_and_columns():
    trans = np.array([[[0, 0, 3], [0, 0, 3], [2, 2, 0]]], dtype=float)
    cls, reps = layout_classes(trans, 3)
    assert cls.tolist() == [0, 0, 1] and reps.tolist() == [0, 2]


def _brute_inter(t, c):
    P, L, _ = t.shape
    best = math.inf
    for cuts in itertools.combinations(range(1, L), P - 1):
        bounds = (0,) + cuts + (L,)
        lat = [t[i, bounds[i], bounds[i + 1] - 1] for i in range(P)]
        if not all(map(math.isfinite, lat)):
            continue
        best = min(best, sum(lat) + (c - 1) * max(lat))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_alpa_inter_op_dp_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    P, L, c = int(rng.integers(1, 4)), 6, int(rng.integers(1, 6))
    t = np.full((P, L, L), math.inf)
    for i in range(P):
        for a in range(L):
            for b in range(a, L):
                if rng.random() > 0.1:
                    t[i, a, b] = (b - a + 1) * rng.uniform(0.5, 1.5)
    value, stage_of = inter_op(t, c)
    expect = _brute_inter(t, c)
    assert value == pytest.approx(expect)
    if math.isfinite(expect):
        assert stage_of[0] == 0 and stage_of[-1] == P - 1 and set(np.diff(stage_of)) <= {0, 1}


def test_balanced_split_minimises_the_largest_stage():
    w = np.array([[5, 1, 1, 1, 1, 5]] * 3, dtype=float)
    stage_of = balanced_split(w, 3)
    loads = [w[0][stage_of == i].sum() for i in range(3)]
    assert max(loads) == 5 and stage_of.tolist() == [0, 1, 1, 1, 1, 2]
    assert balanced_split(w[:, :2], 3) is None


def _program(rng, L, K, P, c):
    from uniap.program import StageProgram

    A = rng.uniform(1, 5, (L, K))
    G = rng.uniform(0, 2, (L, K))
    Ms = rng.integers(0, 3, (L, K)).astype(float)
    Ma = rng.integers(0, 2, (L, K)).astype(float)
    R = rng.uniform(0, 1, (L - 1, K, K))
    R[:, np.arange(K), np.arange(K)] = 0.0
    allowed = rng.random((L, K)) > 0.1
    allowed[:, 0] = True
    inflight = np.array([min(c, P - i) for i in range(P)], dtype=float)
    return StageProgram(A=A, G=G, Ms=Ms, Ma=Ma, R=R, Rp=np.zeros_like(R), allowed=allowed, stages=P, micro_batches=c,
                        inflight=inflight, memory_capacity=float(rng.integers(4, 9)), group=np.arange(L))


@pytest.mark.parametrize("seed", range(6))
def test_alpa_two_passes_match_brute_force(seed):
    from uniap.baselines.alpa import alpa_program

    rng = np.random.default_rng(200 + seed)
    L, K, P, c = 5, 3, int(rng.integers(1, 4)), int(rng.integers(1, 5))
    prog = _program(rng, L, K, P, c)
    cap = prog.memory_capacity
    cost = np.where(prog.allowed, prog.A + prog.G / c, math.inf)

    def stage_cost(i, a, b):
        return _brute(cost, prog.R, prog.Ms + prog.inflight[i] * prog.Ma, cap, a, b)[0]

    best = math.inf
    for cuts in itertools.combinations(range(1, L), P - 1):
        bounds = (0,) + cuts + (L,)
        lat = [stage_cost(i, bounds[i], bounds[i + 1] - 1) for i in range(P)]
        if all(map(math.isfinite, lat)):
            best = min(best, sum(lat) + (c - 1) * max(lat))
    found = alpa_program(prog, bins=int(cap))
    if not math.isfinite(best):
        assert found is None
        return
    stage_of, strategy_of = found
    lat = []
    for i in range(P):
        us = np.flatnonzero(stage_of == i)
        assert sum(prog.Ms[u, strategy_of[u]] + prog.inflight[i] * prog.Ma[u, strategy_of[u]] for u in us) <= cap
        lat.append(sum(cost[u, strategy_of[u]] for u in us) + sum(prog.R[u, strategy_of[u], strategy_of[u + 1]]
                                                                  for u in us[:-1]))
    assert sum(lat) + (c - 1) * max(lat) == pytest.approx(best)
