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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uniap.solve.linear import Builder, Expr, LinearModel, minus, plus, scaled, term
from uniap.solve.program import SEND_HIDING, StageProgram, interleaved_slots, lower_bound, stage_times
from uniap.solve.reduce import Reduced, Run


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
        self.fits = [_fits(program, reduced, run) for run in runs]
        for run, fits in zip(runs, self.fits):
            self.n.append(bld.variables((P, len(run.keep)), 0, fits, integer=True))
            self.m.append(bld.variables(P, 0, fits.max(axis=1, initial=0), integer=True))
            # Stage windows: each stage needs a layer, so layer u sits on a stage in [P − L + u, u].
            a_lo = (stage >= run.first) | (stage == P - 1)
            self.a.append(bld.variables(P, a_lo, stage >= P - L + run.first, integer=True))
            if run.length == 1:
                self.b.append(self.a[-1])
                self.s.append(None), self.l.append(None), self.t.append(None), self.y.append(None)
                continue
            b_lo = (stage >= run.last) | (stage == P - 1)
            self.b.append(bld.variables(P, b_lo, stage >= P - L + run.last, integer=True))
            C = run.classes
            self.s.append(bld.variables((P, C), 0, 1, integer=True))
            self.l.append(bld.variables((P, C), 0, 1, integer=True))
            self.t.append(bld.variables((P, C, C), 0, run.length - 1, integer=True))
            self.y.append(bld.variables((P, C), 0, 1, integer=True))
        last_stage = P - 1
        self.EA = [bld.variables((P - 1, run.classes, run.classes), 0, 1) if run.length > 1 else None
                   for run in runs]
        self.EB = [bld.variables((P, runs[r].classes, runs[r + 1].classes), 0, 1) for r in range(len(runs) - 1)]
        self.EC = [bld.variables((last_stage, runs[r].classes, runs[r + 1].classes), 0, 1)
                   for r in range(len(runs) - 1)]
        slowest = max(float(np.min(reduced.A[run.first, run.keep], initial=0.0)) for run in runs)
        # the bottleneck (≥ the slowest layer); interleaved: the steady state's slot, which excess can undercut
        self.B = bld.variables(1, slowest / self.scale if program.virtual_stages == 1 else 0.0)[0]
        self.H = bld.variables(1)[0]
        if program.virtual_stages > 1:
            self.slot = bld.variables(program.pipeline_degree)  # b_d: group d's slot (solve.program)
            self.excess = bld.variables(P)  # each chunk's time beyond its group's slot
            self.send = bld.variables(1)[0]  # the largest send
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

    def _stage_terms(self, i: int) -> tuple[Expr, Expr, Expr]:
        """(p_i, o_i, g_i) as expressions over this formulation's variables (o_i empty for the last stage)."""
        red, runs, tau = self.reduced, self.reduced.runs, self.scale
        p, o, g = [], [], []
        for r, run in enumerate(runs):
            p.append(term(self.n[r][i], red.A[run.first, run.keep] / tau))
            g.append(term(self.n[r][i], red.G[run.first, run.keep] / tau))
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

    # ---- rows --------------------------------------------------------------------------------------------------
    def _rows(self, bld: Builder, program: StageProgram, red: Reduced) -> None:
        P, runs = program.stages, red.runs
        last = len(runs) - 1
        for r, run in enumerate(runs):
            n = self.n[r]
            m = self.m[r]
            bld.row(term(m), run.length, run.length)
            for i in range(P):
                z = self._z(r, i)
                bld.row(plus(term(n[i]), term(m[i], -1.0)), 0, 0)
                if run.length == 1:
                    bld.row(plus(term(m[i]), minus(z)), 0, 0)
                else:
                    bld.row(plus(term(m[i]), minus(z)), 0)
                    bld.row(plus(term(m[i]), term(z[0], -self.fits[r][i].max(initial=0) * z[1])), hi=0)
                if i + 1 < P:
                    bld.row(plus(term(self.a[r][i]), term(self.a[r][i + 1], -1.0)), hi=0)
                    if run.length > 1:
                        bld.row(plus(term(self.b[r][i]), term(self.b[r][i + 1], -1.0)), hi=0)
                if run.length > 1:
                    bld.row(plus(term(self.b[r][i]), term(self.a[r][i], -1.0)), hi=0)
                if r < last:
                    bld.row(plus(term(self.a[r + 1][i]), term(self.b[r][i], -1.0)), hi=0)
            if run.length > 1:
                self._segment_rows(bld, r)
        for i in range(P):
            bld.row(plus(*(self._z(r, i) for r in range(len(runs)))), 1)
        self._edge_rows(bld, P, runs)
        infl = np.asarray(program.inflight, dtype=float)
        cap = float(program.memory_capacity)
        v = program.virtual_stages
        groups = [range(d, P, program.pipeline_degree) for d in range(program.pipeline_degree)]
        terms = [self._stage_terms(i) for i in range(P)]
        objective = [term(self.H), *(o for _, o, _ in terms)]
        if v == 1:
            objective += [term(self.B, program.micro_batches - 1)] + [p for p, _, _ in terms]
            self.add_bottleneck_constraint(bld, terms)
        else:
            objective += [term(self.B, program.micro_batches * v - 1), term(self.slot),
                          term(self.excess, float(program.micro_batches))]
            self.add_slot_constraint(bld, terms, groups)
        for chunks in groups:  # one device group: the sums over its chunks
            bld.row(plus(*(terms[i][2] for i in chunks), term(self.H, -1.0)), hi=0)
        if math.isfinite(cap):
            self.add_memory_constraint(bld, groups, infl, cap)
        if v > 1:
            self._group_count_rows(bld, groups)
            self.add_one_strategy_constraint(bld)
        bld.minimise(plus(*objective))

    def add_memory_constraint(self, bld: Builder, groups, infl: np.ndarray, cap: float) -> None:
        """Each device group's bytes fit: per chunk i its layers' static bytes and `inflight[i]` micro-batches of
        activations, or, where the program has occupancy patterns (interleaved), one row per pattern."""
        red, runs, program = self.reduced, self.reduced.runs, self.program
        P = program.pipeline_degree
        for d, chunks in enumerate(groups):
            # per chunk i = k·P + d: micro-batches held, by pattern
            patterns = [infl] if program.held is None else \
                [np.repeat(h, P) for h in np.asarray(program.held, dtype=float)[d] if h.any()]
            for held in patterns:
                mem = [term(self.n[r][i], (red.Ms[run.first, run.keep] + held[i] * red.Ma[run.first, run.keep])
                            / cap) for i in chunks for r, run in enumerate(runs)]
                bld.row(plus(*mem), hi=1.0)

    def add_bottleneck_constraint(self, bld: Builder, terms) -> None:
        """Plain pipelines: B ≥ p_i + (o_{i−1} + o_i)/2 and B ≥ o_i for every stage i (solve.program)."""
        for i, (p, o, _) in enumerate(terms):
            around = [scaled(terms[i - 1][1], 0.5)] if i > 0 else []
            if len(o[0]):
                around.append(scaled(o, 0.5))
                bld.row(plus(o, term(self.B, -1.0)), hi=0)
            bld.row(plus(p, *around, term(self.B, -1.0)), hi=0)

    def add_slot_constraint(self, bld: Builder, terms, groups) -> None:
        """Interleaved: each chunk's excess ≥ its time − its group's slot b_d, b_d ≥ 1.5 × the largest send,
        B ≥ every b_d (solve.program)."""
        for d, chunks in enumerate(groups):
            for i in chunks:
                bld.row(plus(terms[i][0], term(self.slot[d], -1.0), term(self.excess[i], -1.0)), hi=0)
            bld.row(plus(term(self.send, SEND_HIDING), term(self.slot[d], -1.0)), hi=0)
            bld.row(plus(term(self.slot[d]), term(self.B, -1.0)), hi=0)
        for _, o, _ in terms:
            if len(o[0]):
                bld.row(plus(o, term(self.send, -1.0)), hi=0)

    def add_one_strategy_constraint(self, bld: Builder) -> None:
        """Interleaved: each device group runs a stretch of identical layers under one strategy, in all of its
        chunks (solve.reduce): one binary per strategy and group, the group's counts ≤ the run's length · chosen."""
        P = self.program.pipeline_degree
        for _, covering in self.reduced.shared():
            keys = sorted({int(k) for r in covering for k in self.reduced.runs[r].keep})
            for d in range(P):
                chosen = bld.variables(len(keys), 0, 1, integer=True)
                bld.row(term(chosen), 1, 1)
                for r in covering:
                    run = self.reduced.runs[r]
                    for j, k in enumerate(run.keep):
                        bld.row(plus(term(self.n[r][d::P, j]), term(chosen[keys.index(int(k))], -float(run.length))),
                                hi=0)

    def _group_count_rows(self, bld: Builder, groups) -> None:
        """Interleaved programs: how many layers of run r device group d holds, Σ of m over its chunks, as an integer
        variable of its own. A group's time and memory depend on these totals, not on how they are split into its
        chunks, so branching on them settles the bottleneck before the (nearly symmetric) splits: with them HiGHS
        proved llama2-70b on 64 GPUs (P = 4, c = 64, v = 5) beaten in 2 s instead of 16 s."""
        for r, run in enumerate(self.reduced.runs):
            if run.length == 1:
                continue
            for chunks in groups:
                held = bld.variables(1, 0, run.length, integer=True)
                bld.row(plus(term(held), *(term(self.m[r][i], -1.0) for i in chunks)), 0, 0)

    def group_rows(self, counts: list[np.ndarray]) -> list[tuple[Expr, float, float]]:
        """Rows holding an interleaved program to given device-group contents: counts[r][d, j] layers of run r
        under its kept strategy j on group d, summed over the group's chunks (solve.group_relaxation). What
        is left to choose is where the chunks are cut and the order inside them."""
        P = self.program.pipeline_degree
        return [(term(self.n[r][d::P, j]), float(held[d, j]), float(held[d, j]))
                for r, held in enumerate(counts) for d in range(P) for j in range(held.shape[1])]

    def _segment_rows(self, bld: Builder, r: int) -> None:
        """Flow conservation of classes inside run r's segment on each stage, and 'class used' indicators."""
        run = self.reduced.runs[r]
        s, l, t, y = self.s[r], self.l[r], self.t[r], self.y[r]
        for i in range(self.program.stages):
            z = self._z(r, i)
            bld.row(plus(term(s[i]), minus(z)), 0, 0)
            bld.row(plus(term(l[i]), minus(z)), 0, 0)
            for c in range(run.classes):
                count = self._count(r, i, c)
                bld.row(plus(count, term(s[i, c], -1.0), term(t[i, :, c], -1.0)), 0, 0)
                bld.row(plus(count, term(l[i, c], -1.0), term(t[i, c, :], -1.0)), 0, 0)
                bld.row(plus(count, term(y[i, c], -float(self.fits[r][i, run.cls == c].max()))), hi=0)
        for expr, lo, hi in self.cuts([(r, frozenset([c])) for c in range(run.classes)]):
            bld.row(expr, lo, hi)

    def _edge_rows(self, bld: Builder, P: int, runs) -> None:
        """Kind totals (linear in the steps) and marginals of the edges between consecutive segments."""
        last = len(runs) - 1
        a, b = self.a, self.b
        for r in range(len(runs)):
            for i in range(P):
                prev_b = [term(b[r][i - 1], -1.0)] if i > 0 else []
                if self.EA[r] is not None and i + 1 < P:
                    bld.row(plus(term(self.EA[r][i]), term(a[r][i], -1.0), term(b[r][i])), 0, 0)
                if r < last:
                    bld.row(plus(term(self.EB[r][i]), term(a[r + 1][i], -1.0), *(minus(e) for e in prev_b)), 0, 0)
                    if i + 1 < P:
                        bld.row(plus(term(self.EC[r][i]), term(b[r][i], -1.0), term(a[r + 1][i])), 0, 0)
                for c in range(runs[r].classes):
                    out = self._out_edges(r, i, c)
                    if not (r == last and i == P - 1):
                        bld.row(plus(*out, minus(self._last(r, i, c))), 0, 0)
                    if not (r == 0 and i == 0):
                        bld.row(plus(*self._in_edges(r, i, c), minus(self._first(r, i, c))), 0, 0)

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
    def cuts(self, subtours: list[tuple[int, frozenset[int]]]) -> list[tuple[Expr, float, float]]:
        """Connectivity rows forbidding each sub-tour class set S of run r on every stage: if class c0 ∈ S is used,
        the segment enters S (from outside S, or by starting in S). New rows only; empty if all were added."""
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
                rows += [(plus(enter, term(y[i, c0], -1.0)), 0.0, math.inf) for c0 in sorted(S)]
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
            where = {int(k): j for j, k in enumerate(run.keep)}
            if any(int(k) not in where for k in strategy_of[span]):
                return None
            j = np.array([where[int(k)] for k in strategy_of[span]])
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
        run_of = np.repeat(np.arange(len(runs)), [run.length for run in runs])
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
        if program.virtual_stages == 1:
            x[self.B] = max(times.bottleneck / self.scale, self.model.lb[self.B])
            return x
        _, B, slots, excess = interleaved_slots(program, times.chunk_p[None, :], times.o[None, :])
        x[self.slot] = slots[0] / self.scale
        x[self.excess] = excess[0] / self.scale
        x[self.send] = times.o.max(initial=0.0) / self.scale
        x[self.B] = max(B[0] / self.scale, self.model.lb[self.B])
        return x
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
                    inner = self.reduced.inner(r, self.reduced.R)
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


def _fits(program: StageProgram, reduced: Reduced, run: Run) -> np.ndarray:
    """(P, K_r) most layers of the run that stage i can hold under each kept strategy: the run's length, the
    layers left after one per other stage, and what the memory capacity allows. Tight bounds here are tight
    big-Ms for the 'segment non-empty' and 'class used' rows."""
    P, L = program.stages, program.layers
    most = float(min(run.length, L - P + 1))
    per_layer = (reduced.Ms[run.first, run.keep][None, :]
                 + np.asarray(program.inflight, dtype=float)[:, None] * reduced.Ma[run.first, run.keep][None, :])
    with np.errstate(divide="ignore"):
        by_memory = np.floor(program.memory_capacity / per_layer * (1 + 1e-9))
    return np.minimum(most, np.nan_to_num(by_memory, nan=most, posinf=most))


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
