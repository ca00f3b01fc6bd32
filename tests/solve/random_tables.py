"""Random cost tables for solver tests: small enough for the enumeration oracle, with runs of identical layers."""

from __future__ import annotations

import numpy as np

from uniap.cost.tables import held_array, placement
from uniap.program import StageProgram
from uniap.schedules import schedule_named


def random_program(seed: int, *, layers: int = 6, strategies: int = 3, stages: int = 2, micro_batches: int = 4,
                   runs: list[int] | None = None, layouts: list[int] | None = None, memory: float | None = 40.0,
                   schedule: str = "1f1b", virtual_stages: int = 1, periods: list[int] | None = None) -> StageProgram:
    """Costs drawn uniformly; `runs` (lengths summing to `layers`) makes each run's layers identical, with one
    shared (arbitrary, non-metric) R and Rp inside it; `periods` (one per run) makes a run repeat that many
    different layers instead, each with its own R and Rp to the next; `layouts` (a class id per strategy) makes R and Rp depend on
    the strategies' classes only, as in the real cost model. `memory` is the capacity (None: unlimited).
    `virtual_stages` v > 1: interleaved 1F1B, `stages` device groups of v chunks each (P·v stages in the chain)."""
    rng = np.random.default_rng(seed)
    L, K, P = layers, strategies, stages
    runs = runs or [1] * L
    periods = periods or [1] * len(runs)
    assert sum(runs) == L and len(periods) == len(runs)
    cls = np.arange(K) if layouts is None else np.asarray(layouts)

    def edge():
        by_class = rng.uniform(0, 3, (cls.max() + 1, cls.max() + 1))
        return by_class[np.ix_(cls, cls)]

    A, G, Ms, Ma = (np.empty((L, K)) for _ in range(4))
    allowed = np.empty((L, K), dtype=bool)
    R, Rp = np.empty((L - 1, K, K)), np.empty((L - 1, K, K))
    group = np.empty(L, dtype=int)  # which drawn row each layer has: equal layers share one
    u = 0
    for n, period in zip(runs, periods):
        phases = []
        for _ in range(period):
            rows = rng.uniform(1, 10, K), rng.uniform(0, 4, K), rng.uniform(0, 10, K), rng.uniform(0, 3, K)
            ok = rng.random(K) > 0.2
            ok[rng.integers(K)] = True
            phases.append((rows, ok, edge(), edge()))
        for j in range(n):
            rows, ok, inner, inner_p = phases[j % period]
            A[u], G[u], Ms[u], Ma[u] = rows
            allowed[u], group[u] = ok, len(set(group[:u])) if j < period else group[u - period]
            if u < L - 1:
                R[u], Rp[u] = (inner, inner_p) if j < n - 1 else (edge(), edge())
            u += 1
    A[~allowed] = np.inf  # disallowed entries may hold anything: the solvers must not read them
    if virtual_stages > 1 and not schedule_named(schedule).interleaved:
        schedule = "interleaved-1f1b"
    chosen = schedule_named(schedule)
    inflight = chosen.inflight(P, micro_batches, virtual_stages)
    # a schedule that splits the backward: 5-60 % of each layer's time is its weight pass (equal layers, equal share)
    weights = np.where(allowed, A * rng.uniform(0.05, 0.6, (L, K))[group], 0.0) if chosen.split_backward else None
    return StageProgram(A=A, G=G, Ms=Ms, Ma=Ma, R=R, Rp=Rp, allowed=allowed, stages=P * virtual_stages,
                        micro_batches=micro_batches, inflight=np.array(inflight, dtype=float),
                        memory_capacity=np.inf if memory is None else memory, group=group,
                        virtual_stages=virtual_stages,
                        held=held_array(chosen, P, micro_batches, virtual_stages) if chosen.interleaved else None,
                        placement=placement(chosen, P, virtual_stages),
                        weight_gradient=weights, split_schedule=chosen.name if chosen.split_backward else None)


def random_case(seed: int, max_layers: int = 7) -> StageProgram:
    """A random size, run structure, layout structure and memory tightness (some cases infeasible)."""
    rng = np.random.default_rng(10_000 + seed)
    K = int(rng.integers(1, 4))
    L = int(rng.integers(3, max_layers + 1))
    P = int(rng.integers(1, min(3, L) + 1))
    cuts = sorted(rng.choice(np.arange(1, L), size=int(rng.integers(0, min(3, L - 1) + 1)), replace=False).tolist())
    runs = np.diff([0, *cuts, L]).tolist()
    layouts = sorted(rng.integers(0, 2, K).tolist()) if rng.random() < 0.5 else None
    memory = float(rng.uniform(12, 60)) if rng.random() < 0.8 else None
    return random_program(seed, layers=L, strategies=K, stages=P, micro_batches=int(rng.integers(1, 6)), runs=runs,
                          layouts=layouts, memory=memory, schedule="gpipe" if rng.random() < 0.3 else "1f1b")


def check_encode(program: StageProgram, seed: int, plans: int = 20, periodic: bool = False) -> None:
    """On random plans of `program`: the MILP's objective at a plan's point is `evaluate`'s value there, and the
    cheap bound is below it (the formulation and the formula agree wherever the solver can land)."""
    from uniap.solve.formulation import Formulation
    from uniap.solve.program import evaluate, lower_bound
    from uniap.solve.reduce import reduce_program

    form = Formulation(program, reduce_program(program, fold=True, periodic=periodic))
    rng = np.random.default_rng(seed)
    L, S = program.layers, program.stages
    for _ in range(plans):
        cuts = np.sort(rng.choice(np.arange(1, L), size=S - 1, replace=False))
        stage_of = np.searchsorted(cuts, np.arange(L), side="right")
        strategy_of = np.array([rng.choice(np.flatnonzero(program.allowed[u])) for u in range(L)])
        x = form.encode(stage_of, strategy_of)
        value = evaluate(program, stage_of, strategy_of)
        if x is None or not np.isfinite(value):
            continue
        assert abs(float(form.model.cost @ x) * form.scale - value) <= 1e-9 * value
        assert lower_bound(program) <= value * (1 + 1e-9)


def assert_same_optimum(program: StageProgram, solution, reference) -> None:
    """`solution` is the enumeration oracle's `reference` optimum (or both are nothing), proven, priced as
    `evaluate` prices it, with the chunks in chain order and every one holding a layer."""
    from uniap.solve.program import evaluate

    if reference is None:
        assert solution is None
        return
    assert solution is not None and solution.optimal and solution.gap == 0.0
    assert abs(solution.objective - reference.objective) <= 1e-6 * reference.objective
    assert abs(solution.objective - evaluate(program, solution.stage_of, solution.strategy_of)) \
        <= 1e-9 * solution.objective
    assert np.all(np.diff(solution.stage_of) >= 0) and len(np.unique(solution.stage_of)) == program.stages


def check_matches_reference(program: StageProgram) -> None:
    """The MILP, folded and unfolded, returns the enumeration oracle's optimum (`assert_same_optimum`)."""
    from uniap.solve.milp import solve
    from uniap.solve.reference import solve_reference

    reference = solve_reference(program)
    for fold in (True, False):
        assert_same_optimum(program, solve(program, fold=fold), reference)


def model_chain(seed: int, base: int, memory: tuple[float, float], extra_layers: int = 3, rounds: int = 3,
                **options) -> StageProgram:
    """A chain shaped like a model (a first layer, a run of identical blocks, a last layer) of 3 strategies on
    (P, v) = (2, 2), (2, 3) or (3, 2) by seed, with up to `extra_layers` − 1 layers beyond P·v, P to P·(rounds −
    1) micro-batches and a capacity drawn from `memory`; its random draws seeded by base + seed."""
    rng = np.random.default_rng(base + seed)
    P, v = [(2, 2), (2, 3), (3, 2)][seed % 3]
    L = P * v + int(rng.integers(0, extra_layers))
    return random_program(seed, layers=L, strategies=3, stages=P, micro_batches=P * int(rng.integers(1, rounds)),
                          runs=[1, L - 2, 1], memory=float(rng.uniform(*memory)), virtual_stages=v, **options)

