"""UniAP's MIQP as an exact MILP over folded runs of identical layers.

Variables, per run r (see reduce.py) and stage i:

* ``n[r][i,k]``  integer: layers of run r that stage i runs under kept strategy k (binary when the run is one layer),
  ``m[r][i]`` = Σ_k n[r][i,k] as an integer variable of its own: branching on how many layers a stage holds is what
  closes the bottleneck gap (without it HiGHS branched on single strategy counts and stalled at 5 % gaps);
* ``a[r][i]``, ``b[r][i]``  binary steps: run r has started / finished by stage i (one variable when the run is one
  layer: the "step" form q[u,i] = "layer u is on a stage ≤ i"). The run's segment on stage i is non-empty iff
  ``z = a[r][i] − b[r][i−1]`` is 1, so contiguity and order are linear;
* for runs of ≥ 2 layers: ``s``/``l`` (layout class of the segment's first/last layer), ``t[c,c']`` (integer count
  of neighbours inside the segment going from class c to c'), ``y`` (class used). Flow conservation ties them to the
  class counts: N[c] = s[c] + Σ t[·,c] = l[c] + Σ t[c,·];
* edges between the last layer of one segment and the first of the next, of three kinds with the tight (Alpa)
  marginals Σ_c' E[c,c'] = l[c], Σ_c E[c,c'] = s[c']: ``EA`` run r continues on stage i+1 (cost Rp inside the run),
  ``EB`` run r+1 follows on the same stage (R between runs), ``EC`` run r+1 starts stage i+1 (Rp between runs).
  Each kind's total is linear in a and b, so they are continuous and integral at integral a, b, s, l;
* a run that repeats a pattern of p layers (reduce.py, plain and zero-bubble pipelines) has n, s, l, y per kept
  entry and class of each of its phases, t and EA from one phase to the next only, and ``phase_start`` rows that
  start each segment with the phase that follows the run's layers on the stages before it;
* ``B`` ≥ every p_i and o_i (the bottleneck), ``H`` ≥ every g_i;
* interleaved programs only: the integer total of run r on device group d (Σ of m over the group's chunks).

Objective Σ p + Σ o + (c − 1)·B + H, memory rows per stage. Interleaved programs (v = virtual_stages > 1) cut the
chain into P·v stages ("chunks"), chunk i on device group i mod P: the objective becomes (Σ p + Σ o)/v +
(c − 1/v)·B + H, and B, H and memory bound the sums over each group's chunks (solve.program has the formula). Times are divided by `scale` (the cheap lower bound on
the TPI, so the optimum is ≳ 1 and absolute tolerances act as relative ones) and bytes by the capacity. Counts are
bounded by what fits in memory (`_fits`), which also tightens the big-M of the "non-empty" and "class used" rows.

Flow conservation alone allows a segment's transitions to contain closed walks that do not touch the path from
its first to its last layer (sub-tours): they are cheaper than any real order of those layers. The single-class
connectivity rows (a used class is entered) are in the model from the start; `decode` finds the sub-tours that
remain, `cuts` returns the connectivity inequalities that forbid them (the caller adds these and solves again), so
the final optimum is exactly the unfolded one.

Each kind of row has its method, `add_<kind>_constraint`, and every row is named by its kind and indices
("memory[stage=2]", "flow_in[run=1,stage=0,cls=2]"; linear.named), so an infeasible program can say which kinds
conflict (milp.explain_infeasible). `_rows` calls them in a fixed order, which is part of the numerics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uniap.solve.linear import Builder, Expr, LinearModel, Row, minus, named, plus, scaled, term
from uniap.program import StageProgram
from uniap.schedules import FORWARD_SHARE, schedule_named
from uniap.solve.program import (SEND_HIDING, interleaved_slots, least_bubble, lower_bound, split_levels, split_passes,
                                 split_send_hops, stage_times)
from uniap.solve.reduce import Reduced, Run


PASSES = ("forward", "input", "weight")
"""The passes of a split backward's chunk, in the order of the `level` and `over` variables."""

BOUNDS = {"n": "layers per stage and strategy, at most what fits in memory",
          "m": "layers per stage, at most what fits in memory",
          "a": "the stage window of a run's first layer", "b": "the stage window of a run's last layer"}
"""What the bounds of the formulation's variable families say, for naming a conflict that involves them."""


@dataclass(frozen=True)
class Decoded:
    """A MILP point turned into a plan; `subtours` lists (run, classes) of closed walks that were spliced in."""

    stage_of: np.ndarray
    strategy_of: np.ndarray
    subtours: list[tuple[int, frozenset[int]]]


class Formulation:
    """The MILP of one reduced program, with the maps between its points and plans."""

    def __init__(self, program: StageProgram, reduced: Reduced):
        self.program, self.reduced = program, reduced
        P, L = program.stages, program.layers
        runs = reduced.runs
        self.scale = scale_of(program, reduced)
        self._added: set[tuple[int, frozenset[int]]] = set()
        bld = Builder()
        stage = np.arange(P)
        self.n, self.m, self.a, self.b, self.s, self.l, self.t, self.y = ([] for _ in range(8))
        self.fits = [_fits(program, reduced, r) for r in range(len(runs))]
        self.most = [_most(program, run, fits) for run, fits in zip(runs, self.fits)]
        for r, (run, fits) in enumerate(zip(runs, self.fits)):
            self.n.append(bld.variables((P, len(run.keep)), 0, fits, integer=True, name=f"n[run={r}]"))
            self.m.append(bld.variables(P, 0, self.most[r], integer=True, name=f"m[run={r}]"))
            # Stage windows: each stage needs a layer, so layer u sits on a stage in [P − L + u, u].
            a_lo = (stage >= run.first) | (stage == P - 1)
            self.a.append(bld.variables(P, a_lo, stage >= P - L + run.first, integer=True, name=f"a[run={r}]"))
            if run.length == 1:
                self.b.append(self.a[-1])
                self.s.append(None), self.l.append(None), self.t.append(None), self.y.append(None)
                continue
            b_lo = (stage >= run.last) | (stage == P - 1)
            self.b.append(bld.variables(P, b_lo, stage >= P - L + run.last, integer=True, name=f"b[run={r}]"))
            C = run.classes
            self.s.append(bld.variables((P, C), 0, 1, integer=True, name=f"s[run={r}]"))
            self.l.append(bld.variables((P, C), 0, 1, integer=True, name=f"l[run={r}]"))
            # a periodic run's transitions go from each phase to the next only
            self.t.append(bld.variables((P, C, C), 0, (run.length - 1) * run.follows(), integer=True,
                                        name=f"t[run={r}]"))
            self.y.append(bld.variables((P, C), 0, 1, integer=True, name=f"y[run={r}]"))
        last_stage = P - 1
        self.EA = [bld.variables((P - 1, run.classes, run.classes), 0, run.follows(), name=f"EA[run={r}]")
                   if run.length > 1 else None for r, run in enumerate(runs)]
        self.EB = [bld.variables((P, runs[r].classes, runs[r + 1].classes), 0, 1, name=f"EB[run={r}]")
                   for r in range(len(runs) - 1)]
        self.EC = [bld.variables((last_stage, runs[r].classes, runs[r + 1].classes), 0, 1, name=f"EC[run={r}]")
                   for r in range(len(runs) - 1)]
        slowest = max(float(np.min(reduced.kept(r, reduced.A), initial=0.0)) for r in range(len(runs)))
        self.H = bld.variables(1, name="H")[0]
        self.split = program.split_schedule is not None
        if self.split:  # a split backward (solve.program.split_backward_tpi)
            self.level = bld.variables(len(PASSES), name="level")  # F̂, Î, Ŵ: the equal-chunk levels
            self.over = bld.variables((len(PASSES), P), name="over")  # each chunk's F, I, W above its level
            self.bubble = bld.variables(1, name="bubble")[0]  # the largest fill-and-drain piece at the levels
            self.send = bld.variables(1, name="send")[0]  # the largest send
        else:
            # the bottleneck (≥ the slowest layer); interleaved: the steady state's slot, which excess can undercut
            self.B = bld.variables(1, slowest / self.scale if program.virtual_stages == 1 else 0.0, name="B")[0]
        if program.virtual_stages > 1 and not self.split:
            self.slot = bld.variables(program.pipeline_degree, name="slot")  # b_d: group d's slot (solve.program)
            self.excess = bld.variables(P, name="excess")  # each chunk's time beyond its group's slot
            self.send = bld.variables(1, name="send")[0]  # the largest send
        self._rows(bld, program, reduced)
        self.model: LinearModel = bld.model()

    # ---- expressions -------------------------------------------------------------------------------------------
    def _z(self, r: int, i: int) -> Expr:
        """1 iff run r has layers on stage i."""
        return plus(term(self.a[r][i]), term(self.b[r][i - 1], -1.0)) if i > 0 else term(self.a[r][i])

    def _count(self, r: int, i: int, c: int) -> Expr:
        """Layers of run r on stage i in layout class c."""
        run = self.reduced.runs[r]
        return term(self.n[r][i, run.cls == c])

    def _first(self, r: int, i: int, c: int) -> Expr:
        return term(self.s[r][i, c]) if self.s[r] is not None else self._count(r, i, c)

    def _last(self, r: int, i: int, c: int) -> Expr:
        return term(self.l[r][i, c]) if self.l[r] is not None else self._count(r, i, c)

    def _weight_pass(self, i: int) -> Expr:
        """Chunk i's weight-pass seconds (split backward): its layers' weight passes (resharding has none)."""
        red, tau = self.reduced, self.scale
        return plus(*(term(self.n[r][i], red.kept(r, red.W) / tau) for r in range(len(red.runs))))

    def _stage_terms(self, i: int) -> tuple[Expr, Expr, Expr]:
        """(p_i, o_i, g_i) as expressions over this formulation's variables (o_i empty for the last stage)."""
        red, runs, tau = self.reduced, self.reduced.runs, self.scale
        p, o, g = [], [], []
        for r, run in enumerate(runs):
            p.append(term(self.n[r][i], red.kept(r, red.A) / tau))
            g.append(term(self.n[r][i], red.kept(r, red.G) / tau))
            if self.t[r] is not None:
                p.append(term(self.t[r][i], red.inner(r, red.R) / tau))
            if r + 1 < len(runs):
                p.append(term(self.EB[r][i], red.between(r, red.R) / tau))
            if i + 1 < self.program.stages:
                if self.EA[r] is not None:
                    o.append(term(self.EA[r][i], red.inner(r, red.Rp) / tau))
                if r + 1 < len(runs):
                    o.append(term(self.EC[r][i], red.between(r, red.Rp) / tau))
        return plus(*p), plus(*o), plus(*g)

    # ---- rows, one method per kind (each row named by its kind and indices: linear.named) ----------------------
    def _rows(self, bld: Builder, program: StageProgram, red: Reduced) -> None:
        """Every row, in a fixed order (the order is part of the numerics: HiGHS's path depends on it)."""
        P, runs = program.stages, red.runs
        last = len(runs) - 1
        for r, run in enumerate(runs):
            self.add_run_placed_constraint(bld, r)
            for i in range(P):
                self.add_stage_count_constraint(bld, r, i)
                self.add_nonempty_constraint(bld, r, i)
                if run.length > 1:
                    self.add_segment_size_constraint(bld, r, i)
                if i + 1 < P:
                    self.add_started_step_constraint(bld, r, i)
                    if run.length > 1:
                        self.add_finished_step_constraint(bld, r, i)
                if run.length > 1:
                    self.add_finish_after_start_constraint(bld, r, i)
                if r < last:
                    self.add_run_order_constraint(bld, r, i)
            if run.length > 1:
                self._segment_rows(bld, r)
        for i in range(P):
            self.add_stage_used_constraint(bld, i)
        self._edge_rows(bld, P, runs)
        infl = np.asarray(program.inflight, dtype=float)
        cap = float(program.memory_capacity)
        v = program.virtual_stages
        groups = [[int(i) for i in chunks] for chunks in program.group_chunks]  # each device group's chunks
        terms = [self._stage_terms(i) for i in range(P)]
        c = program.micro_batches
        objective = [term(self.H)] + ([] if self.split else [o for _, o, _ in terms])
        if self.split:  # the sends are in the chunks' passes (solve.program.split_passes)
            objective += [term(self.level, float(c * v)), term(self.over, float(c)), term(self.bubble),
                          term(self.send, float(split_send_hops(program)))]
            self.add_split_levels_constraint(bld, terms)
        elif v == 1:
            objective += [term(self.B, c - 1)] + [p for p, _, _ in terms]
            self.add_bottleneck_constraint(bld, terms)
        else:
            objective += [term(self.B, program.micro_batches * v - 1), term(self.slot),
                          term(self.excess, float(program.micro_batches))]
            self.add_slot_constraint(bld, terms, groups)
        self.add_sync_constraint(bld, terms, groups)
        if math.isfinite(cap):
            self.add_memory_constraint(bld, groups, infl, cap)
        if v > 1:
            self._group_count_rows(bld, groups)
            self.add_one_strategy_constraint(bld)
        bld.minimise(plus(*objective))

    def _where(self, d: int) -> dict[str, int]:
        """The index of a device group's row: its stage in a plain pipeline, its group in an interleaved one."""
        return {"stage": d} if self.program.virtual_stages == 1 else {"group": d}

    def add_run_placed_constraint(self, bld: Builder, r: int) -> None:
        """Every layer of run r is placed: Σ_i m[r][i] = |r|."""
        run = self.reduced.runs[r]
        bld.row(term(self.m[r]), run.length, run.length, name=named("run_placed", run=r))

    def add_stage_count_constraint(self, bld: Builder, r: int, i: int) -> None:
        """m[r][i] = Σ_k n[r][i,k]: the layers of run r on stage i, over its strategies."""
        bld.row(plus(term(self.n[r][i]), term(self.m[r][i], -1.0)), 0, 0, name=named("stage_count", run=r, stage=i))

    def add_nonempty_constraint(self, bld: Builder, r: int, i: int) -> None:
        """A stage where run r's segment is non-empty (z = 1) holds one of its layers: m ≥ z (m = z for a
        one-layer run, which is then q[u,i] − q[u,i−1], the layer's placement)."""
        z = self._z(r, i)
        expr = plus(term(self.m[r][i]), minus(z))
        if self.reduced.runs[r].length == 1:
            bld.row(expr, 0, 0, name=named("nonempty", run=r, stage=i))
        else:
            bld.row(expr, 0, name=named("nonempty", run=r, stage=i))

    def add_segment_size_constraint(self, bld: Builder, r: int, i: int) -> None:
        """Only a non-empty segment holds layers: m ≤ most·z (the big-M is what stage i can hold, `_most`)."""
        z = self._z(r, i)
        bld.row(plus(term(self.m[r][i]), term(z[0], -self.most[r][i] * z[1])), hi=0,
                name=named("segment_size", run=r, stage=i))

    def add_started_step_constraint(self, bld: Builder, r: int, i: int) -> None:
        """a is a step: once run r has started by stage i it has by stage i + 1 (a[r][i] ≤ a[r][i+1])."""
        bld.row(plus(term(self.a[r][i]), term(self.a[r][i + 1], -1.0)), hi=0,
                name=named("started_step", run=r, stage=i))

    def add_finished_step_constraint(self, bld: Builder, r: int, i: int) -> None:
        """b is a step: b[r][i] ≤ b[r][i+1]."""
        bld.row(plus(term(self.b[r][i]), term(self.b[r][i + 1], -1.0)), hi=0,
                name=named("finished_step", run=r, stage=i))

    def add_finish_after_start_constraint(self, bld: Builder, r: int, i: int) -> None:
        """A run finishes no earlier than it starts: b[r][i] ≤ a[r][i]."""
        bld.row(plus(term(self.b[r][i]), term(self.a[r][i], -1.0)), hi=0,
                name=named("finish_after_start", run=r, stage=i))

    def add_run_order_constraint(self, bld: Builder, r: int, i: int) -> None:
        """Runs follow in chain order: run r + 1 starts by stage i only if run r has finished by it
        (a[r+1][i] ≤ b[r][i]), so every stage holds a contiguous piece of the chain."""
        bld.row(plus(term(self.a[r + 1][i]), term(self.b[r][i], -1.0)), hi=0, name=named("run_order", run=r, stage=i))

    def add_stage_used_constraint(self, bld: Builder, i: int) -> None:
        """Every stage holds a layer: Σ_r z[r][i] ≥ 1."""
        bld.row(plus(*(self._z(r, i) for r in range(len(self.reduced.runs)))), 1, name=named("stage_used", stage=i))

    def add_sync_constraint(self, bld: Builder, terms, groups) -> None:
        """H ≥ g over each device group: the gradient synchronisation, summed over the group's chunks."""
        for d, chunks in enumerate(groups):
            bld.row(plus(*(terms[i][2] for i in chunks), term(self.H, -1.0)), hi=0,
                    name=named("sync", **self._where(d)))

    def add_memory_constraint(self, bld: Builder, groups, infl: np.ndarray, cap: float) -> None:
        """Each device group's bytes fit: per chunk i its layers' static bytes and `inflight[i]` micro-batches of
        activations, or, where the program has occupancy patterns (interleaved), one row per pattern."""
        red, runs, program = self.reduced, self.reduced.runs, self.program
        P = program.pipeline_degree
        for d, chunks in enumerate(groups):
            # per chunk i (at position i // P of its group): micro-batches held, by pattern
            patterns = [infl] if program.held is None else \
                [np.repeat(h, P) for h in np.asarray(program.held, dtype=float)[d] if h.any()]
            for q, held in enumerate(patterns):
                mem = [term(self.n[r][i], (red.kept(r, red.Ms) + held[i] * red.kept(r, red.Ma)) / cap)
                       for i in chunks for r in range(len(runs))]
                where = self._where(d) if program.held is None else {"group": d, "pattern": q}
                bld.row(plus(*mem), hi=1.0, name=named("memory", **where))

    def add_bottleneck_constraint(self, bld: Builder, terms) -> None:
        """Plain pipelines: B ≥ p_i + (o_{i−1} + o_i)/2 ("bottleneck") and B ≥ o_i ("send_bottleneck") for every
        stage i (solve.program)."""
        for i, (p, o, _) in enumerate(terms):
            around = [scaled(terms[i - 1][1], 0.5)] if i > 0 else []
            if len(o[0]):
                around.append(scaled(o, 0.5))
                bld.row(plus(o, term(self.B, -1.0)), hi=0, name=named("send_bottleneck", stage=i))
            bld.row(plus(p, *around, term(self.B, -1.0)), hi=0, name=named("bottleneck", stage=i))

    def add_slot_constraint(self, bld: Builder, terms, groups) -> None:
        """Interleaved: each chunk's excess ≥ its time − its group's slot b_d ("excess"), b_d ≥ 1.5 × the largest
        send ("slot_send"), B ≥ every b_d ("slot_bottleneck"), the largest send ≥ every o_i ("send")
        (solve.program)."""
        for d, chunks in enumerate(groups):
            for i in chunks:
                bld.row(plus(terms[i][0], term(self.slot[d], -1.0), term(self.excess[i], -1.0)), hi=0,
                        name=named("excess", stage=i))
            bld.row(plus(term(self.send, SEND_HIDING), term(self.slot[d], -1.0)), hi=0,
                    name=named("slot_send", group=d))
            bld.row(plus(term(self.slot[d]), term(self.B, -1.0)), hi=0, name=named("slot_bottleneck", group=d))
        self._add_send_rows(bld, terms)

    def _add_send_rows(self, bld: Builder, terms) -> None:
        """The largest send ≥ every chunk's send o_i ("send")."""
        for i, (_, o, _) in enumerate(terms):
            if len(o[0]):
                bld.row(plus(o, term(self.send, -1.0)), hi=0, name=named("send", stage=i))

    def add_split_levels_constraint(self, bld: Builder, terms) -> None:
        """A split backward (solve.program.split_backward_tpi): each chunk's forward, input and weight pass exceed
        their levels F̂, Î, Ŵ by at most its `over` ("forward_over", "input_over", "weight_over": F = p/3,
        I = 2p/3 − W), every level is at least the largest send ("forward_level_send", …, "send"), and the bubble is at least
        each of the schedule's pieces at the levels ("bubble"). At the least objective the levels sit at the
        formula's, which is then its value."""
        program = self.program
        for i, (p, _, _) in enumerate(terms):
            w = self._weight_pass(i)
            passes = (scaled(p, FORWARD_SHARE), plus(scaled(p, 1 - FORWARD_SHARE), minus(w)), w)
            for kind, (name, expr) in enumerate(zip(PASSES, passes)):
                bld.row(plus(expr, term(self.level[kind], -1.0), term(self.over[kind, i], -1.0)), hi=0,
                        name=named(f"{name}_over", stage=i))
        self._add_send_rows(bld, terms)
        for kind in range(len(PASSES)):
            bld.row(plus(term(self.send), term(self.level[kind], -1.0)), hi=0, name=named(f"{PASSES[kind]}_level_send"))
        for q, piece in enumerate(schedule_named(program.split_schedule).bubble(program.pipeline_degree)):
            bld.row(plus(term(self.level, np.asarray(piece, dtype=float)), term(self.bubble, -1.0)), hi=0,
                    name=named("bubble", piece=q))

    def add_one_strategy_constraint(self, bld: Builder) -> None:
        """Interleaved: each device group runs a stretch of identical layers under one strategy, in all of its
        chunks (solve.reduce): one binary per strategy and group ("strategy_chosen": they sum to 1), the group's
        counts ≤ the run's length · chosen ("one_strategy")."""
        chunks = self.program.group_chunks
        for q, (_, covering) in enumerate(self.reduced.shared()):
            keys = sorted({int(k) for r in covering for k in self.reduced.runs[r].keep})
            for d in range(self.program.pipeline_degree):
                chosen = bld.variables(len(keys), 0, 1, integer=True, name=f"chosen[stretch={q},group={d}]")
                bld.row(term(chosen), 1, 1, name=named("strategy_chosen", stretch=q, group=d))
                for r in covering:
                    run = self.reduced.runs[r]
                    for j, k in enumerate(run.keep):
                        bld.row(plus(term(self.n[r][chunks[d], j]), term(chosen[keys.index(int(k))],
                                                                            -float(run.length))),
                                hi=0, name=named("one_strategy", run=r, group=d, strategy=int(k)))

    def _group_count_rows(self, bld: Builder, groups) -> None:
        """Interleaved programs: how many layers of run r device group d holds, Σ of m over its chunks, as an integer
        variable of its own ("group_count"). A group's time and memory depend on these totals, not on how they are
        split into its chunks, so branching on them settles the bottleneck before the (nearly symmetric) splits:
        with them HiGHS proved llama2-70b on 64 GPUs (P = 4, c = 64, v = 5) beaten in 2 s instead of 16 s."""
        for r, run in enumerate(self.reduced.runs):
            if run.length == 1:
                continue
            for d, chunks in enumerate(groups):
                held = bld.variables(1, 0, run.length, integer=True, name=f"held[run={r},group={d}]")
                bld.row(plus(term(held), *(term(self.m[r][i], -1.0) for i in chunks)), 0, 0,
                        name=named("group_count", run=r, group=d))

    def group_rows(self, counts: list[np.ndarray]) -> list[Row]:
        """Rows holding an interleaved program to given device-group contents: counts[r][d, j] layers of run r
        under its kept strategy j on group d, summed over the group's chunks (solve.group_relaxation). What
        is left to choose is where the chunks are cut and the order inside them."""
        P = self.program.pipeline_degree
        return [(term(self.n[r][d::P, j]), float(held[d, j]), float(held[d, j]),
                 named("group_contents", run=r, group=d, strategy=int(self.reduced.runs[r].keep[j])))
                for r, held in enumerate(counts) for d in range(P) for j in range(held.shape[1])]

    def _segment_rows(self, bld: Builder, r: int) -> None:
        """The rows of run r's segments (runs of ≥ 2 layers), stage by stage in this order: first and last class,
        flow conservation of classes, 'class used' indicators; then the single-class connectivity cuts."""
        run = self.reduced.runs[r]
        for i in range(self.program.stages):
            self.add_segment_ends_constraint(bld, r, i)
            for c in range(run.classes):
                self.add_flow_constraint(bld, r, i, c)
                self.add_class_used_constraint(bld, r, i, c)
            if run.period > 1:
                self.add_phase_start_constraint(bld, r, i)
        if run.period > 1:
            self.add_phase_placed_constraint(bld, r)
        bld.rows(self.cuts([(r, frozenset([c])) for c in range(run.classes)]))

    def _before(self, r: int, i: int, tau: int) -> Expr:
        """c_τ: the layers of phase τ of periodic run r on the stages before stage i."""
        return term(self.n[r][:i][:, self.reduced.runs[r].phase == tau])

    def add_phase_start_constraint(self, bld: Builder, r: int, i: int) -> None:
        """A periodic run's segment on stage i starts with the phase that follows the run's layers on earlier
        stages. Those hold c_0 ≥ c_1 ≥ … ≥ c_{p−1} ≥ c_0 − 1 layers of each phase, so the next phase is τ where
        c_{τ−1} − c_τ = 1, or 0 where c_0 = c_{p−1}: Σ s[phase τ] ≤ c_{τ−1} − c_τ ("phase_start", τ ≥ 1) and
        Σ s[phase 0] ≤ 1 − c_0 + c_{p−1}. The flow rows then hold the segment to the phases in cyclic order."""
        run = self.reduced.runs[r]
        first_of = run.class_phase
        for tau in range(run.period):
            start = term(self.s[r][i, first_of == tau])
            if tau == 0:
                expr, hi = plus(start, self._before(r, i, 0), minus(self._before(r, i, run.period - 1))), 1.0
            else:
                expr, hi = plus(start, minus(self._before(r, i, tau - 1)), self._before(r, i, tau)), 0.0
            bld.row(expr, hi=hi, name=named("phase_start", run=r, stage=i, phase=tau))

    def add_phase_placed_constraint(self, bld: Builder, r: int) -> None:
        """Every layer of each phase of a periodic run is placed: Σ_i n[r][i, phase τ] = its count."""
        run = self.reduced.runs[r]
        for tau, count in enumerate(run.phase_counts()):
            bld.row(self._before(r, self.program.stages, tau), float(count), float(count),
                    name=named("phase_placed", run=r, phase=tau))

    def add_segment_ends_constraint(self, bld: Builder, r: int, i: int) -> None:
        """A non-empty segment has one first and one last layer: Σ_c s[c] = z ("segment_first"), Σ_c l[c] = z
        ("segment_last")."""
        z = self._z(r, i)
        bld.row(plus(term(self.s[r][i]), minus(z)), 0, 0, name=named("segment_first", run=r, stage=i))
        bld.row(plus(term(self.l[r][i]), minus(z)), 0, 0, name=named("segment_last", run=r, stage=i))

    def add_flow_constraint(self, bld: Builder, r: int, i: int, c: int) -> None:
        """Flow conservation of layout class c in run r's segment on stage i: N[c] = s[c] + Σ t[·,c] ("flow_in"),
        N[c] = l[c] + Σ t[c,·] ("flow_out")."""
        s, l, t = self.s[r], self.l[r], self.t[r]
        count = self._count(r, i, c)
        bld.row(plus(count, term(s[i, c], -1.0), term(t[i, :, c], -1.0)), 0, 0, name=named("flow_in", run=r, stage=i,
                                                                                          cls=c))
        bld.row(plus(count, term(l[i, c], -1.0), term(t[i, c, :], -1.0)), 0, 0, name=named("flow_out", run=r, stage=i,
                                                                                           cls=c))

    def add_class_used_constraint(self, bld: Builder, r: int, i: int, c: int) -> None:
        """y[c] marks a used class: N[c] ≤ fits·y[c]."""
        run = self.reduced.runs[r]
        bld.row(plus(self._count(r, i, c), term(self.y[r][i, c], -float(self.fits[r][i, run.cls == c].max()))), hi=0,
                name=named("class_used", run=r, stage=i, cls=c))

    def _edge_rows(self, bld: Builder, P: int, runs) -> None:
        """Kind totals (linear in the steps) and marginals of the edges between consecutive segments, run by run and
        stage by stage in this order."""
        last = len(runs) - 1
        for r in range(len(runs)):
            for i in range(P):
                if self.EA[r] is not None and i + 1 < P:
                    self.add_edges_ea_constraint(bld, r, i)
                if r < last:
                    self.add_edges_eb_constraint(bld, r, i)
                    if i + 1 < P:
                        self.add_edges_ec_constraint(bld, r, i)
                for c in range(runs[r].classes):
                    if not (r == last and i == P - 1):
                        self.add_edges_out_constraint(bld, r, i, c)
                    if not (r == 0 and i == 0):
                        self.add_edges_in_constraint(bld, r, i, c)

    def add_edges_ea_constraint(self, bld: Builder, r: int, i: int) -> None:
        """Σ EA[r][i] = a[r][i] − b[r][i]: run r continues from stage i on stage i + 1 (one edge, Rp inside it)."""
        bld.row(plus(term(self.EA[r][i]), term(self.a[r][i], -1.0), term(self.b[r][i])), 0, 0,
                name=named("edges_EA", run=r, stage=i))

    def add_edges_eb_constraint(self, bld: Builder, r: int, i: int) -> None:
        """Σ EB[r][i] = a[r+1][i] − b[r][i−1]: run r + 1 follows run r on stage i (R between the runs)."""
        prev_b = [term(self.b[r][i - 1], -1.0)] if i > 0 else []
        bld.row(plus(term(self.EB[r][i]), term(self.a[r + 1][i], -1.0), *(minus(e) for e in prev_b)), 0, 0,
                name=named("edges_EB", run=r, stage=i))

    def add_edges_ec_constraint(self, bld: Builder, r: int, i: int) -> None:
        """Σ EC[r][i] = b[r][i] − a[r+1][i]: run r ends stage i and run r + 1 starts stage i + 1 (Rp between)."""
        bld.row(plus(term(self.EC[r][i]), term(self.b[r][i], -1.0), term(self.a[r + 1][i])), 0, 0,
                name=named("edges_EC", run=r, stage=i))

    def add_edges_out_constraint(self, bld: Builder, r: int, i: int, c: int) -> None:
        """Alpa's marginal: the edges out of the segment's last layer in class c sum to l[c]."""
        bld.row(plus(*self._out_edges(r, i, c), minus(self._last(r, i, c))), 0, 0,
                name=named("edges_out", run=r, stage=i, cls=c))

    def add_edges_in_constraint(self, bld: Builder, r: int, i: int, c: int) -> None:
        """Alpa's marginal: the edges into the segment's first layer in class c sum to s[c]."""
        bld.row(plus(*self._in_edges(r, i, c), minus(self._first(r, i, c))), 0, 0,
                name=named("edges_in", run=r, stage=i, cls=c))

    def _out_edges(self, r: int, i: int, c: int) -> list[Expr]:
        P, out = self.program.stages, []
        if self.EA[r] is not None and i + 1 < P:
            out.append(term(self.EA[r][i, c, :]))
        if r < len(self.EB):
            out.append(term(self.EB[r][i, c, :]))
            if i + 1 < P:
                out.append(term(self.EC[r][i, c, :]))
        return out

    def _in_edges(self, r: int, i: int, c: int) -> list[Expr]:
        into = []
        if self.EA[r] is not None and i > 0:
            into.append(term(self.EA[r][i - 1, :, c]))
        if r > 0:
            into.append(term(self.EB[r - 1][i, :, c]))
            if i > 0:
                into.append(term(self.EC[r - 1][i - 1, :, c]))
        return into

    # ---- sub-tour cuts -----------------------------------------------------------------------------------------
    def cuts(self, subtours: list[tuple[int, frozenset[int]]]) -> list[Row]:
        """Connectivity rows forbidding each sub-tour class set S of run r on every stage: if class c0 ∈ S is used,
        the segment enters S (from outside S, or by starting in S). New rows only; empty if all were added.
        Named "class_entered" for a single class (those are in the model from the start), "subtour_cut" else."""
        rows = []
        for r, S in subtours:
            if (r, S) in self._added:
                continue
            self._added.add((r, S))
            inside = np.zeros(self.reduced.runs[r].classes, dtype=bool)
            inside[list(S)] = True
            t, s, y = self.t[r], self.s[r], self.y[r]
            for i in range(self.program.stages):
                enter = plus(term(t[i][np.ix_(~inside, inside)]), term(s[i, inside]))
                kind = "class_entered" if len(S) == 1 else "subtour_cut"
                rows += [(plus(enter, term(y[i, c0], -1.0)), 0.0, math.inf, named(kind, run=r, stage=i, cls=c0))
                         for c0 in sorted(S)]
        return rows

    # ---- plans <-> points --------------------------------------------------------------------------------------
    def encode(self, stage_of, strategy_of) -> np.ndarray | None:
        """The MILP point of a plan (None if it uses a strategy this formulation dropped). Its objective times
        `scale` is evaluate(plan) for any feasible plan — the tests hold the formulation to that."""
        program, runs = self.program, self.reduced.runs
        stage_of, strategy_of = np.asarray(stage_of), np.asarray(strategy_of)
        P = program.stages
        x = np.zeros(self.model.columns)
        layer_class = np.zeros(program.layers, dtype=int)
        stages = np.arange(P)
        for r, run in enumerate(runs):
            span = slice(run.first, run.last + 1)
            where = {(int(tau), int(k)): j for j, (tau, k) in enumerate(zip(run.phase, run.keep))}
            wanted = list(zip(np.arange(run.length) % run.period, strategy_of[span]))
            if any((int(tau), int(k)) not in where for tau, k in wanted):
                return None
            j = np.array([where[int(tau), int(k)] for tau, k in wanted])
            st, cls = stage_of[span], run.cls[j]
            layer_class[span] = cls
            np.add.at(x, self.n[r][st, j], 1.0)
            np.add.at(x, self.m[r][st], 1.0)
            x[self.a[r]] = stages >= st.min()
            x[self.b[r]] = stages >= st.max()
            if self.t[r] is None:
                continue
            for i in np.unique(st):
                seg = cls[st == i]
                x[self.s[r][i, seg[0]]] = 1.0
                x[self.l[r][i, seg[-1]]] = 1.0
                np.add.at(x, self.t[r][i, seg[:-1], seg[1:]], 1.0)
                x[self.y[r][i, np.unique(seg)]] = 1.0
        run_of = self.reduced.run_of
        for u in range(program.layers - 1):
            r, i, i2 = run_of[u], stage_of[u], stage_of[u + 1]
            c, c2 = layer_class[u], layer_class[u + 1]
            if run_of[u + 1] == r:
                if i2 != i:
                    x[self.EA[r][i, c, c2]] = 1.0
            elif i2 == i:
                x[self.EB[r][i, c, c2]] = 1.0
            else:
                x[self.EC[r][i, c, c2]] = 1.0
        times = stage_times(program, stage_of, strategy_of)
        x[self.H] = times.g.max() / self.scale
        if self.split:
            passes = split_passes(times.chunk_p[None, :], times.chunk_w[None, :])
            send = times.o.max(initial=0.0)
            low, high = split_levels(passes, program.virtual_stages, np.array([send]))
            bubble, level = least_bubble(schedule_named(program.split_schedule).bubble(program.pipeline_degree),
                                         low, high)
            x[self.level] = level[0] / self.scale
            x[self.over] = np.maximum(np.concatenate(passes) - level[0][:, None], 0.0) / self.scale
            x[self.bubble] = float(bubble[0]) / self.scale
            x[self.send] = send / self.scale
            return x
        if program.virtual_stages == 1:
            x[self.B] = max(times.bottleneck / self.scale, self.model.lb[self.B])
            return x
        _, B, slots, excess = interleaved_slots(program, times.chunk_p[None, :], times.o[None, :])
        x[self.slot] = slots[0] / self.scale
        x[self.excess] = excess[0] / self.scale
        x[self.send] = times.o.max(initial=0.0) / self.scale
        x[self.B] = max(B[0] / self.scale, self.model.lb[self.B])
        return x

    def decode(self, x: np.ndarray) -> Decoded:
        """The plan of a MILP point. Sub-tours in a segment's transitions are spliced into its path where they add
        the least resharding, so the plan is always real; they are reported for `cuts`."""
        program, runs = self.program, self.reduced.runs
        P = program.stages
        stage_of = np.empty(program.layers, dtype=int)
        strategy_of = np.empty(program.layers, dtype=int)
        subtours = []
        for r, run in enumerate(runs):
            counts = np.rint(x[self.n[r]]).astype(int)
            u = run.first
            for i in range(P):
                m = int(counts[i].sum())
                if m == 0:
                    continue
                if self.t[r] is None:
                    order = [int(run.cls[np.argmax(counts[i])])]
                else:
                    start = int(np.argmax(x[self.s[r][i]]))
                    order, circuits = _trail(np.rint(x[self.t[r][i]]).astype(int), start)
                    inner = np.where(run.follows(), self.reduced.inner(r, self.reduced.R), math.inf)
                    for circuit in circuits:
                        subtours.append((r, frozenset(circuit)))
                        order = _splice(order, circuit, inner)
                pools = {c: [int(k) for j, k in enumerate(run.keep) if run.cls[j] == c for _ in range(counts[i, j])]
                         for c in range(run.classes)}
                strategy_of[u:u + m] = [pools[c].pop() for c in order]
                stage_of[u:u + m] = i
                u += m
        return Decoded(stage_of, strategy_of, subtours)


def scale_of(program: StageProgram, reduced: Reduced) -> float:
    """Seconds per objective unit: the cheap lower bound on the TPI, so the optimum is ≳ 1 and absolute
    tolerances act as relative ones."""
    bound = lower_bound(program)
    return bound if 0 < bound < math.inf else max(float(np.max(reduced.A, initial=0.0)), 1.0)


def _fits(program: StageProgram, reduced: Reduced, r: int) -> np.ndarray:
    """(P, K_r) most layers of run r that stage i can hold under each kept entry: its phase's layers in the run,
    the layers left after one per other stage, and what the memory capacity allows. Tight bounds here are tight
    big-Ms for the 'segment non-empty' and 'class used' rows."""
    P, L = program.stages, program.layers
    run = reduced.runs[r]
    most = np.minimum(run.phase_counts()[run.phase], L - P + 1).astype(float)[None, :]
    per_layer = (reduced.kept(r, reduced.Ms)[None, :]
                 + np.asarray(program.inflight, dtype=float)[:, None] * reduced.kept(r, reduced.Ma)[None, :])
    with np.errstate(divide="ignore"):
        by_memory = np.floor(program.memory_capacity / per_layer * (1 + 1e-9))
    return np.minimum(most, np.where(np.isnan(by_memory) | np.isinf(by_memory), most, by_memory))


def _most(program: StageProgram, run: Run, fits: np.ndarray) -> np.ndarray:
    """(P,) most layers of the run a stage can hold: the most of each phase, summed over the phases (one phase:
    the most under any strategy), and no more than the run's length or the layers left after one per other stage."""
    per_phase = [fits[:, run.phase == tau].max(axis=1, initial=0) for tau in range(run.period)]
    return np.minimum(np.sum(per_phase, axis=0), min(run.length, program.layers - program.stages + 1))


def _trail(T: np.ndarray, start: int) -> tuple[list[int], list[list[int]]]:
    """Hierholzer on the transition multigraph T[c, c']: the walk from `start` using every transition it can reach
    (a node sequence), and the closed walks left over (each as its nodes, closing node not repeated)."""
    T = T.copy()

    def walk(v: int) -> list[int]:
        stack, path = [v], []
        while stack:
            w = stack[-1]
            nxt = np.flatnonzero(T[w])
            if len(nxt):
                T[w, nxt[0]] -= 1
                stack.append(int(nxt[0]))
            else:
                path.append(stack.pop())
        return path[::-1]

    order = walk(start)
    circuits = []
    while T.any():
        closed = walk(int(np.flatnonzero(T.sum(axis=1))[0]))
        circuits.append(closed[:-1])
    return order, circuits


def _splice(order: list[int], circuit: list[int], cost: np.ndarray) -> list[int]:
    """Insert a closed walk (rotated as needed) after the position of `order` where it adds the least cost."""
    best, best_delta = None, math.inf
    k = len(circuit)
    for rot in range(k):
        q = circuit[rot:] + circuit[:rot]
        for j in range(len(order)):
            delta = cost[order[j], q[0]] - cost[q[-1], q[0]]
            if j + 1 < len(order):
                delta += cost[q[-1], order[j + 1]] - cost[order[j], order[j + 1]]
            if delta < best_delta:
                best, best_delta = (j, q), delta
    j, q = best
    return order[:j + 1] + q + order[j + 1:]
