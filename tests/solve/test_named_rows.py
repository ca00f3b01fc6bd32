"""Every MILP row is named by meaning, and an infeasible program's error names the kinds of rows that conflict."""

import numpy as np
import pytest
from random_tables import random_case, random_program

from uniap.errors import UniapError
from uniap.solve import milp
from uniap.solve.backends import HighsBackend
from uniap.solve.formulation import Formulation, scale_of
from uniap.solve.group_relaxation import GroupRelaxation
from uniap.solve.linear import Builder, conflict_line, label, named, term
from uniap.solve.milp import InfeasibleError, explain_infeasible, solve
from uniap.solve.program import lower_bound
from uniap.solve.reduce import reduce_program

FORMULATION_KINDS = {
    "run_placed", "stage_count", "nonempty", "segment_size", "started_step", "finished_step", "finish_after_start",
    "run_order", "segment_first", "segment_last", "flow_in", "flow_out", "class_used", "class_entered",
    "stage_used", "edges_EA", "edges_EB", "edges_EC", "edges_out", "edges_in", "bottleneck", "send_bottleneck",
    "excess", "slot_send", "slot_bottleneck", "send", "sync", "memory", "group_count", "strategy_chosen",
    "one_strategy", "phase_start", "phase_placed"}


def programs():
    yield from (random_case(seed) for seed in range(30))
    for seed in range(4):
        yield random_program(seed, layers=8, strategies=3, stages=2, runs=[1, 6, 1], layouts=[0, 1, 1],
                             memory=60.0, virtual_stages=2)
        yield random_program(seed, layers=8, strategies=3, stages=2 + seed % 2, runs=[1, 6, 1], memory=45.0)
        yield random_program(seed, layers=9, strategies=3, stages=2, runs=[1, 7, 1], periods=[1, 2 + seed % 2, 1],
                             memory=45.0)


def assert_all_named(model):
    assert len(model.names) == model.rows
    for kind, at in model.names:
        assert isinstance(kind, str) and kind
        assert all(isinstance(k, str) and isinstance(v, int) for k, v in at)
    assert sum(model.kinds().values()) == model.rows
    assert all(model.row_name(i).startswith(model.names[i][0]) for i in range(model.rows))


@pytest.mark.parametrize("fold", [True, False])
def test_every_row_of_the_formulation_is_named(fold):
    seen = set()
    for program in programs():
        reduced = reduce_program(program, fold=fold, periodic=fold and program.virtual_stages == 1)  # as milp.py
        if any(len(run.keep) == 0 for run in reduced.runs):
            continue
        form = Formulation(program, reduced)
        model = form.model
        assert_all_named(model)
        kinds = model.kinds()
        assert set(kinds) <= FORMULATION_KINDS
        seen |= set(kinds)
        P, runs = program.stages, reduced.runs
        # counts per kind that follow from the shape of the program
        assert kinds["run_placed"] == len(runs)
        assert kinds["stage_count"] == kinds["nonempty"] == len(runs) * P
        assert kinds["stage_used"] == P
        assert kinds.get("run_order", 0) == (len(runs) - 1) * P
        assert kinds["sync"] == program.pipeline_degree
        assert kinds.get("phase_start", 0) == P * sum(run.period for run in runs if run.period > 1)
        assert kinds.get("phase_placed", 0) == sum(run.period for run in runs if run.period > 1)
        if np.isfinite(program.memory_capacity) and program.held is None:
            assert kinds["memory"] == program.pipeline_degree
        if program.virtual_stages == 1:
            assert kinds["bottleneck"] == P and "excess" not in kinds
        else:
            assert kinds["excess"] == P and kinds["slot_bottleneck"] == program.pipeline_degree
        # every column belongs to a named family
        assert model.families[0][0] == 0 and all(name != "unnamed" for _, name in model.families)
        assert model.family(form.n[0][0, 0]).startswith("n[") and model.family(form.H) == "H"
    assert {"memory", "one_strategy", "edges_in", "bottleneck", "excess"} <= seen
    assert ("flow_in" in seen) == ("phase_start" in seen) == fold  # unfolded, every run is one layer


def test_rows_added_later_are_named():
    program = random_program(1, layers=8, strategies=3, stages=2, runs=[1, 6, 1], layouts=[0, 1, 1],
                             memory=60.0, virtual_stages=2)
    form = Formulation(program, reduce_program(program, fold=True))
    cuts = form.cuts([(1, frozenset({0, 1}))])
    assert cuts and {row[3][0] for row in cuts} == {"subtour_cut"}
    counts = [np.zeros((program.pipeline_degree, len(run.keep)), dtype=int) for run in form.reduced.runs]
    assert {row[3][0] for row in form.group_rows(counts)} == {"group_contents"}
    backend = HighsBackend(form.model)
    backend.add_rows(cuts)
    assert len(backend._names) == form.model.rows + len(cuts)


@pytest.mark.parametrize("edges", [False, True])
def test_every_row_of_the_group_relaxation_is_named(edges):
    for seed in range(4):
        program = random_program(seed, layers=8, strategies=3, stages=2, runs=[1, 6, 1], layouts=[0, 1, 1],
                                 memory=60.0, virtual_stages=2)
        reduced = reduce_program(program, fold=True)
        model = GroupRelaxation(program, reduced, scale_of(program, reduced), edges).model
        assert_all_named(model)
        kinds = model.kinds()
        assert kinds["run_placed"] == len(reduced.runs) and kinds["memory"] == program.pipeline_degree
        assert ("degree_in" in kinds) == edges and ("group_size" in kinds) == (not edges)


def test_builder_requires_a_name():
    bld = Builder()
    x = bld.variables(2, name="x")
    with pytest.raises(TypeError):
        bld.row(term(x), 1)
    bld.row(term(x), 1, name=named("cover", item=0))
    model = bld.model()
    assert model.row_name(0) == "cover[item=0]" and model.kinds() == {"cover": 1} and model.family(1) == "x"


def test_only_keeps_the_rows_asked_for():
    program = random_case(5)
    model = Formulation(program, reduce_program(program, fold=True)).model
    same = model.only(np.ones(model.rows, dtype=bool))
    for field in ("start", "index", "value", "row_lo", "row_hi"):
        assert np.array_equal(getattr(same, field), getattr(model, field))
    odd = model.only(np.arange(model.rows) % 2 == 1)
    assert odd.rows == model.rows // 2 and odd.names == model.names[1::2]
    x = np.random.default_rng(0).random(model.columns)
    assert np.allclose(odd.activity(x), model.activity(x)[1::2])


def test_conflict_line():
    rows = [named("memory", stage=i) for i in range(4)] + [named("one_strategy", run=1, group=d) for d in (0, 2)] * 6
    assert conflict_line(rows) == "memory[stage=0..3] (4 rows) conflict with one_strategy[run=1,group=0,2] (12 rows)"
    assert conflict_line([named("run_placed", run=0)], ["m[run=0]", "m[run=0]"], {"m": "layers per stage"}) == \
        "run_placed[run=0] (1 row) conflicts with the bounds of m (layers per stage) (2 columns)"
    assert conflict_line([named("memory", stage=1), named("memory", stage=3)]) == \
        "memory[stage=1,3] (2 rows) conflict among themselves"
    assert label(named("chain_start")) == "chain_start"


def test_infeasible_error_names_the_conflicting_kinds():
    # Memory too small for the MILP, though the cheap bound does not see it: the memory rows of both stages
    # conflict with the placement (every layer placed, edges between them).
    program = random_program(2, layers=6, strategies=3, stages=2, memory=12.0)
    assert lower_bound(program) < np.inf
    with pytest.raises(InfeasibleError) as error:
        solve(program, explain=True)
    message = str(error.value)
    assert isinstance(error.value, UniapError) and "\n" not in message
    assert message.startswith("infeasible: ") and "memory[stage=0..1] (2 rows)" in message
    assert " conflict with " in message and "rows)" in message
    # a memory too small for any one layer: the layer counts' bounds (what fits) against the placement
    hopeless = random_program(2, layers=6, strategies=3, stages=2, memory=1.0)
    message = explain_infeasible(hopeless)
    assert message.startswith("infeasible: run_placed[run=") and "at most what fits in memory" in message
    # interleaved: the memory rows per group and occupancy pattern
    interleaved = random_program(3, layers=8, strategies=3, stages=2, runs=[1, 6, 1], layouts=[0, 1, 1],
                                 memory=20.0, virtual_stages=2)
    with pytest.raises(InfeasibleError, match=r"memory\[group=0\.\.1,pattern=0\] \(2 rows\)"):
        solve(interleaved, explain=True)


def test_feasible_programs_and_the_fallback(monkeypatch):
    feasible = random_program(2, layers=6, strategies=3, stages=2, memory=18.0)
    assert solve(feasible, explain=True) is not None and explain_infeasible(feasible) is None
    program = random_program(2, layers=6, strategies=3, stages=2, memory=12.0)
    assert solve(program) is None  # without explain, None as before
    monkeypatch.setattr(HighsBackend, "conflict", lambda self, time_limit=None: None)  # no IIS found
    message = explain_infeasible(program)  # then whole kinds, each dropped in turn
    assert message.startswith("infeasible: ") and "memory (2 rows)" in message and "whole kinds" in message
    kinds = [part.split(" (")[0] for part in message.removeprefix("infeasible: ").split(" (whole")[0]
             .replace(" conflict with ", ", ").split(", ")]
    form = Formulation(program, reduce_program(program, fold=True))
    names = np.array([kind for kind, _ in form.model.names])
    assert HighsBackend(form.model.only(np.isin(names, kinds))).solve(None, None, 0.0).status == "infeasible"
    for kind in kinds:  # none can be left out
        rest = [k for k in kinds if k != kind]
        assert HighsBackend(form.model.only(np.isin(names, rest))).solve(None, None, 0.0).status == "optimal"
    monkeypatch.setattr(milp, "_conflicting_kinds", lambda model, time_limit: None)  # that fails too
    assert explain_infeasible(program) is None
    with pytest.raises(InfeasibleError, match="no conflicting rows were identified"):
        solve(program, explain=True)
    monkeypatch.setattr(milp.importlib.util, "find_spec", lambda name: None if name == "highspy" else object())
    assert explain_infeasible(program) is None
