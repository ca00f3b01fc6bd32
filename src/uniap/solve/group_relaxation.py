"""Interleaved programs by device group: the MILP that forgets where the chunks are cut.

A device group's time, gradient sync and memory depend on which layers it holds under which strategies, and on
its edges (resharding inside its chunks, sends at their ends), not on where its v chunks sit in the chain. This
MILP keeps the first and only counts the second; per run r of identical layers (reduce.py) and device group d:

* ``N[r][d, k]`` integer: layers of run r that group d runs under kept strategy k;
* edge counts by layout class (continuous): ``W[d][r][c, c']`` edges inside run r inside a chunk of group d,
  ``Z[d][r]`` the edge from run r's last layer to run r + 1's first inside such a chunk, ``X[d][r]`` and
  ``Y[d][r]`` the same two kinds as chunk boundaries from group d to group d + 1 (mod P), where they are sends;
* every layer has one edge out and one edge in (the chain's first and last layers one fewer), group d has
  v boundaries out (v − 1 for group P − 1, whose last chunk ends the chain), the run-to-run edge is one edge,
  and a layout class a group uses is entered from outside it (no single-class closed walks);
* a_d = Σ A·N + Σ R over its inner edges, o_d = Σ Rp over its boundaries, g_d = Σ G·N, H ≥ g_d; the slot
  terms of solve.program over the group's totals (`add_slot_constraint`);
  memory Σ (Ms + inflight·Ma)·N ≤ capacity at the least in-flight count of the group's chunks, plus what the
  least arrangement of a run over chunks of at most κ layers adds (`add_memory_constraint`);
* objective Σ b + (c·v − 1)·B + c·Σ e + Σ o + H, the TPI of solve.program with each group's excess summed.

Every plan maps to a point whose objective is at most its TPI, so the optimum is a lower bound on the program. What the
counts forget is only that each chunk is one path of layers (they allow closed walks) and where the chunks sit,
so the bound is attained on the zoo models. A coarser form (`edges=False`) drops the edge counts: sends at the
P·v − 1 cheapest edges, no resharding, each group at least v layers; every plan's point then costs at most its
TPI. `chain_plan` builds a plan with given group contents directly, and the chunk MILP with the contents fixed
(`Formulation.group_rows`) finds one when it cannot: when such a plan attains the bound the interleaved
program is solved without branching through the near-equal splits of a group's layers into its chunks
(solve.milp).
"""

from __future__ import annotations

import math

import numpy as np

from uniap.solve.linear import Builder, Expr, minus, named, plus, scaled, term
from uniap.program import StageProgram
from uniap.solve.program import SEND_HIDING, evaluate, least_sends, stage_times
from uniap.solve.reduce import Reduced, undominated


END_STRATEGIES = 3
"""How many other strategies of an end layer `chain_plan` tries (the fastest of those with fewer bytes): each
costs eleven cuts of its group's contents and their evaluations (~0.01 s at pp2·v8)."""


class GroupRelaxation:
    """The device-group MILP of one interleaved program (`program.virtual_stages` > 1); times divided by `scale`."""

    def __init__(self, program: StageProgram, reduced: Reduced, scale: float, edges: bool):
        """`edges` False: the coarser MILP without edge counts — sends at the P·v − 1 cheapest edges of the chain,
        each group at least v layers, and no resharding but between each single-layer end of the chain and its
        neighbour (`add_end_resharding_constraint`). Weaker, and often faster to cut off."""
        P, v = program.pipeline_degree, program.virtual_stages
        self.program, self.reduced, self.scale, self.edges = program, reduced, scale, edges
        runs = reduced.runs
        bld = Builder()
        self.ends = [] if edges else _chain_ends(reduced, P)
        # Without edges a strategy is seen only through A, G, Ms, Ma: one that another beats in all four (of any
        # layout class) is never needed, which leaves a few of a run's strategies (e.g. 10 of 36). At a chain end
        # the end's ρ also sees the resharding between the end and its neighbour (add_end_resharding_constraint):
        # there a strategy must also reshard no worse against each of the other side's.
        self.most = [self._most(r) for r in range(len(runs))]
        if not edges:
            for r, run in enumerate(runs):
                mask = np.tile(_any_class_undominated(reduced, run), (P, 1))
                for d, r_end, r_next, edge, source in self.ends:
                    R = _end_resharding(reduced, edge, source)
                    if r == r_end:
                        mask[d] = _any_class_undominated(reduced, run, [R[:, k] for k in runs[r_next].keep])
                    elif r == r_next:
                        mask[d] = _any_class_undominated(reduced, run, [R[k, :] for k in runs[r_end].keep])
                self.most[r] = self.most[r] * mask
        self.N = [bld.variables((P, len(run.keep)), 0, most, integer=True, name=f"N[run={r}]")
                  for r, (run, most) in enumerate(zip(runs, self.most))]
        self.B = bld.variables(1, name="B")[0]
        self.H = bld.variables(1, name="H")[0]
        for r, run in enumerate(runs):
            self.add_placement_constraint(bld, r, run.length)
        self.chosen: dict[tuple[int, int], tuple[np.ndarray, list[int]]] = {}  # (run, group) → binaries, ids
        self.add_one_strategy_constraint(bld)
        self.end_reshard: dict[int, tuple[int, int, int, Expr]] = {}  # group → (end run, next run, h, ρ)
        self.kappa: dict[tuple[int, int], int] = {}  # (run, group) → κ, the most of the run's layers in one chunk
        self.end_blocks: dict[tuple[int, int], tuple[int, np.ndarray]] = {}  # (run, group) → (position of the
        #   chunk of the chain's end layer on the group, the run's layers in it per strategy: add_slot_constraint)
        self.slot = bld.variables(P, name="slot")  # b_d (solve.program)
        self.excess = bld.variables(P, name="excess")  # Σ over group d's chunks of their time beyond b_d
        least = least_sends(program, np.asarray(program.allowed)) / scale
        objective = [term(self.B, program.micro_batches * v - 1), term(self.H), term(self.slot),
                     term(self.excess, float(program.micro_batches))]
        if edges:
            self._edge_variables(bld)
            self.add_chain_ends_constraint(bld)
            self.add_run_edge_constraint(bld)
        else:
            constant = bld.variables(1, 1, 1, name="one")
            objective.append(term(constant, least))
            self.add_group_size_constraint(bld)
            self.add_end_resharding_constraint(bld)
        sends = []
        for d in range(P):
            a, o, g = self._group_terms(d, edges)
            objective.append(o)
            sends.append(o)
            self.add_slot_constraint(bld, d, a, o)
            if len(g[0]):
                bld.row(plus(g, term(self.H, -1.0)), hi=0, name=named("sync", group=d))
            self.add_memory_constraint(bld, d)
            if edges:
                self.add_degree_constraint(bld, d)
                self.add_class_entered_constraint(bld, d)
                self.add_boundary_count_constraint(bld, d)
        if edges:  # Σ o is also at least the P·v − 1 cheapest edges of the chain (distinct edges, whatever ends)
            bld.row(plus(*sends), least, name=named("least_sends"))
        bld.minimise(plus(*objective))
        self.model = bld.model()

    def _edge_variables(self, bld: Builder) -> None:
        P, runs = self.program.pipeline_degree, self.reduced.runs
        inner = [(run.classes, run.classes) if run.length > 1 else None for run in runs]
        between = [(runs[r].classes, runs[r + 1].classes) for r in range(len(runs) - 1)]
        self.W = [[bld.variables(shape, 0, name=f"W[group={d},run={r}]") if shape else None
                   for r, shape in enumerate(inner)] for d in range(P)]
        self.X = [[bld.variables(shape, 0, name=f"X[group={d},run={r}]") if shape else None
                   for r, shape in enumerate(inner)] for d in range(P)]
        ends = {0, len(runs) - 2}  # edges out of the chain's first layer and into its last: whole (add_slot_constraint)
        self.Z = [[bld.variables(shape, 0, 1, integer=q in ends, name=f"Z[group={d},run={q}]")
                   for q, shape in enumerate(between)] for d in range(P)]
        self.Y = [[bld.variables(shape, 0, 1, name=f"Y[group={d},run={q}]") for q, shape in enumerate(between)]
                  for d in range(P)]
        self.start = bld.variables(runs[0].classes, 0, 1, name="start")  # class of the chain's first layer
        self.end = bld.variables(runs[-1].classes, 0, 1, name="end")  # and of its last

    def _most(self, r: int) -> np.ndarray:
        """(P, K_r) most layers of run r group d can hold under each strategy: the run, or what memory allows."""
        program, run, red = self.program, self.reduced.runs[r], self.reduced
        least_inflight = program.group_inflight.min(axis=1)
        per_layer = red.Ms[run.first, run.keep][None, :] + least_inflight[:, None] * red.Ma[run.first, run.keep]
        with np.errstate(divide="ignore", invalid="ignore"):
            by_memory = np.floor(float(program.memory_capacity) / per_layer * (1 + 1e-9))
        return np.minimum(run.length, np.nan_to_num(by_memory, nan=run.length, posinf=run.length))

    def _classes(self, r: int, d: int) -> list[Expr]:
        """Layers of run r on group d in each layout class."""
        run = self.reduced.runs[r]
        return [term(self.N[r][d, run.cls == c]) for c in range(run.classes)]

    def _group_terms(self, d: int, edges: bool) -> tuple[Expr, Expr, Expr]:
        """(a_d, o_d, g_d) of group d as expressions (o_d empty without edges)."""
        red, runs, tau = self.reduced, self.reduced.runs, self.scale
        a = [term(self.N[r][d], red.A[run.first, run.keep] / tau) for r, run in enumerate(runs)]
        g = [term(self.N[r][d], red.G[run.first, run.keep] / tau) for r, run in enumerate(runs)]
        o = []
        if d in self.end_reshard:
            a.append(self.end_reshard[d][3])
        for r in range(len(runs) if edges else 0):
            if self.W[d][r] is not None:
                a.append(term(self.W[d][r], red.inner(r, red.R) / tau))
                o.append(term(self.X[d][r], red.inner(r, red.Rp) / tau))
            if r + 1 < len(runs):
                a.append(term(self.Z[d][r], red.between(r, red.R) / tau))
                o.append(term(self.Y[d][r], red.between(r, red.Rp) / tau))
        return plus(*a), plus(*o), plus(*g)

    def add_placement_constraint(self, bld: Builder, r: int, length: int) -> None:
        """Every layer of run r sits on some group; each group's total of the run is an integer variable of its
        own, so the solver branches on how many layers a group holds before which strategies they take."""
        total = bld.variables(self.program.pipeline_degree, 0, length, integer=True, name=f"total[run={r}]")
        for d in range(self.program.pipeline_degree):
            bld.row(plus(term(total[d]), term(self.N[r][d], -1.0)), 0, 0, name=named("group_count", run=r, group=d))
        bld.row(term(total), length, length, name=named("run_placed", run=r))

    def add_one_strategy_constraint(self, bld: Builder) -> None:
        """Each group runs a stretch of identical layers under one strategy (solve.reduce): one binary per
        strategy, N ≤ most·chosen."""
        for q, (_, covering) in enumerate(self.reduced.shared()):
            for d in range(self.program.pipeline_degree):
                keys = sorted({int(run.keep[j]) for run, most in ((self.reduced.runs[r], self.most[r][d]) for r in covering)
                               for j in np.flatnonzero(most > 0)})
                if not keys:
                    continue
                chosen = bld.variables(len(keys), 0, 1, integer=True, name=f"chosen[stretch={q},group={d}]")
                self.chosen.update({(r, d): (chosen, keys) for r in covering})
                bld.row(term(chosen), 1, 1, name=named("strategy_chosen", stretch=q, group=d))
                for r in covering:
                    most = self.most[r][d]
                    for j in np.flatnonzero(most > 0):
                        k = keys.index(int(self.reduced.runs[r].keep[j]))
                        bld.row(plus(term(self.N[r][d, j]), term(chosen[k], -float(most[j]))), hi=0,
                                name=named("one_strategy", run=r, group=d, strategy=int(self.reduced.runs[r].keep[j])))

    def add_chain_ends_constraint(self, bld: Builder) -> None:
        """The chain starts on group 0 (chunk 0) and ends on group P − 1 (chunk P·v − 1), one layer each."""
        bld.row(term(self.start), 1, 1, name=named("chain_start"))
        bld.row(term(self.end), 1, 1, name=named("chain_end"))

    def add_run_edge_constraint(self, bld: Builder) -> None:
        """The chain has exactly one edge from run r to run r + 1: inside one group's chunk or a boundary."""
        P = self.program.pipeline_degree
        for r in range(len(self.reduced.runs) - 1):
            bld.row(plus(*(term(self.Z[d][r]) for d in range(P)), *(term(self.Y[d][r]) for d in range(P))), 1, 1,
                    name=named("run_edge", run=r))

    def add_degree_constraint(self, bld: Builder, d: int) -> None:
        """Each layer of group d, counted by layout class, has one edge out (inside its chunk or a boundary to
        group d + 1) and one edge in (inside its chunk or a boundary from group d − 1), but for the chain's ends."""
        P, runs = self.program.pipeline_degree, self.reduced.runs
        previous = (d - 1) % P
        last = len(runs) - 1
        for r in range(len(runs)):
            for c, count in enumerate(self._classes(r, d)):
                out = [term(m[d][r][c, :]) for m in (self.W, self.X) if m[d][r] is not None]
                if r < last:
                    out += [term(self.Z[d][r][c, :]), term(self.Y[d][r][c, :])]
                if r == last and d == P - 1:
                    out.append(term(self.end[c]))
                bld.row(plus(count, *(minus(t) for t in out)), 0, 0, name=named("degree_out", run=r, group=d, cls=c))
                into = [term(self.W[d][r][:, c])] if self.W[d][r] is not None else []
                into += [term(self.X[previous][r][:, c])] if self.X[previous][r] is not None else []
                if r > 0:
                    into += [term(self.Z[d][r - 1][:, c]), term(self.Y[previous][r - 1][:, c])]
                if r == 0 and d == 0:
                    into.append(term(self.start[c]))
                bld.row(plus(count, *(minus(t) for t in into)), 0, 0, name=named("degree_in", run=r, group=d, cls=c))

    def add_class_entered_constraint(self, bld: Builder, d: int) -> None:
        """A layout class group d uses in a run is entered from another class or across a boundary: its layers
        are not all joined to each other in a closed walk (the single-class sub-tours of formulation.py)."""
        for r, run in enumerate(self.reduced.runs):
            if self.W[d][r] is None:
                continue
            most = self._most(r)[d]
            used = bld.variables(run.classes, 0, 1, integer=True, name=f"used[run={r},group={d}]")
            for c, count in enumerate(self._classes(r, d)):
                bld.row(plus(count, term(used[c], -float(most[run.cls == c].max(initial=0)))), hi=0,
                        name=named("class_used", run=r, group=d, cls=c))
                bld.row(plus(count, term(self.W[d][r][c, c], -1.0), term(used[c], -1.0)), 0,
                        name=named("class_entered", run=r, group=d, cls=c))

    def add_boundary_count_constraint(self, bld: Builder, d: int) -> None:
        """Group d's chunks each end in a send to group d + 1, but the chain's last chunk (on group P − 1)."""
        P, v = self.program.pipeline_degree, self.program.virtual_stages
        sends = v - 1 if d == P - 1 else v
        parts = [term(m) for m in self.X[d] if m is not None] + [term(m) for m in self.Y[d]]
        bld.row(plus(*parts), sends, sends, name=named("boundary_count", group=d))

    def add_group_size_constraint(self, bld: Builder) -> None:
        """Without edges: group 0 holds the first layer, group P − 1 the last, and each of a group's v chunks a
        layer."""
        P, v = self.program.pipeline_degree, self.program.virtual_stages
        bld.row(term(self.N[0][0]), 1, name=named("first_layer"))
        bld.row(term(self.N[-1][P - 1]), 1, name=named("last_layer"))
        for d in range(P):
            bld.row(plus(*(term(n[d]) for n in self.N)), v, name=named("group_size", group=d))

    def add_end_resharding_constraint(self, bld: Builder) -> None:
        """Without edges: the resharding between a single-layer end of the chain (the first layer, in chunk 0 on
        group 0; the last, in chunk P·v − 1 on group P − 1) and its neighbour, when they share the end's chunk.
        A binary h says they do; then ρ ≥ R of the strategies group d runs the two under, and ρ joins the
        group's time and the end's chunk (`_edges_inside`); h = 0 leaves the neighbouring run's layers on d to
        its other v − 1 chunks (add_slot_constraint). Every plan's point still costs at most its TPI: a
        strategy the two runs drop on d (`most`) is beaten by a kept one in A, G, Ms, Ma and in its resharding
        against every strategy of the other side, so the point's pair reshards for no more than the plan's. This
        is what the coarse bound most often missed: llama2-70b's head reshards from its blocks' layout, 0.03 s per
        iteration through the excess term, and the edge-count MILP took 0.64 s to find it."""
        for d, r_end, r_next, edge, source in self.ends:
            end, near = self._by_class(r_end, d), self._by_class(r_next, d)
            if not end or not near:
                continue
            R = _end_resharding(self.reduced, edge, source)  # one value per pair of layout classes
            cost = R[np.ix_([k for k, _ in end], [k for k, _ in near])]
            if not (cost > 0).any():
                continue
            h = bld.variables(1, 0, 1, integer=True, name=f"end_shared[group={d}]")[0]
            pair = bld.variables(cost.shape, 0, name=f"end_pair[group={d}]")
            for i, j in zip(*np.nonzero(cost > 0)):  # pair ≥ [end in class i] + [neighbour in class j] + h − 2
                bld.row(plus(term(pair[i, j]), minus(end[i][1]), minus(near[j][1]), term(h, -1.0)), -2.0,
                        name=named("end_pair", group=d, end=int(i), near=int(j)))
            self.end_reshard[d] = (r_end, r_next, h, term(pair, cost / self.scale))

    def _by_class(self, r: int, d: int) -> list[tuple[int, Expr]]:
        """Per layout class of run r that group d may use: (a strategy of it, the binary sum saying group d runs
        the run's layers in that class): of the stretch's `chosen` binaries, or for a single layer outside any
        stretch, of its counts."""
        run, most = self.reduced.runs[r], self.most[r][d]
        usable = {int(run.keep[j]): j for j in np.flatnonzero(most > 0)}
        binaries = None
        if (r, d) in self.chosen:
            chosen, keys = self.chosen[r, d]
            binaries = {k: int(chosen[i]) for i, k in enumerate(keys) if k in usable}
        elif run.length == 1:
            binaries = {k: int(self.N[r][d, j]) for k, j in usable.items()}
        if not binaries:
            return []
        out = []
        for c in range(run.classes):
            members = [k for k in binaries if run.cls[usable[k]] == c]
            if members:
                out.append((members[0], term([binaries[k] for k in members])))
        return out

    def add_slot_constraint(self, bld: Builder, d: int, a: Expr, o: Expr) -> None:
        """Group d's slot b_d ≤ B, at least 1.5 × the mean of its sends, and its chunks' excess over it
        e_d ≥ a_d − v·b_d (solve.program). b_d + e_d is at least the group's largest chunk, which whole layers
        bound from below: with κ the most layers of a run that one of d's chunks holds (v·κ ≥ N, κ ≤ N), that
        chunk takes at least the sum of the κ fastest of the group's layers, and every chunk, the head's too,
        holds at least N − (v − 1)·κ of them. "The q fastest" is min Σ_j A_j·y_j over Σ y = q, 0 ≤ y_j ≤ N_j,
        whose LP dual gives one valid row per price λ: ≥ λ·q − Σ_j (λ − A_j)⁺·N_j; the rows for λ at each A_j
        make it exact. (Groups with several long runs get the κ rows of each, and no head rows.)"""
        v, red, tau = self.program.virtual_stages, self.reduced, self.scale
        t = self.slot[d]
        largest = plus(term(t, -1.0), term(self.excess[d], -1.0))  # − (b_d + e_d) ≥ − the largest chunk
        bld.row(plus(a, term(t, -float(v)), term(self.excess[d], -1.0)), hi=0,
                name=named("excess", group=d))  # e_d ≥ a_d − v·b_d
        if len(o[0]):
            bld.row(plus(scaled(o, SEND_HIDING / v), term(t, -1.0)), hi=0, name=named("slot_send", group=d))
        bld.row(plus(term(t), term(self.B, -1.0)), hi=0, name=named("slot_bottleneck", group=d))
        fills = []  # per run: (κ, the run's counts on d, A over its strategies) to bound what a chunk must hold
        for r, run in enumerate(red.runs):
            most = self.most[r][d]
            if run.length == 1 or not most.any():
                continue
            kappa = bld.variables(1, 0, float(most.max()), integer=True, name=f"kappa[run={r},group={d}]")[0]
            bld.row(plus(term(kappa, float(v)), term(self.N[r][d], -1.0)), 0,
                    name=named("chunk_layers_most", run=r, group=d))  # v·κ ≥ N
            bld.row(plus(term(kappa), term(self.N[r][d], -1.0)), hi=0,
                    name=named("chunk_layers_least", run=r, group=d))  # κ ≤ N
            self.kappa[r, d] = kappa
            fills.append((kappa, self.N[r][d], red.A[run.first, run.keep] / tau, most > 0, r))
        for kappa, counts, A, usable, r in fills:
            for j, lam in enumerate(np.unique(A[usable])):  # the largest chunk: κ layers, at least its κ fastest
                bld.row(plus(term(kappa, lam), term(counts, -np.maximum(lam - A, 0.0)), largest), hi=0,
                        name=named("largest_chunk", run=r, group=d, price=j))
        for r, run in enumerate(red.runs):
            if run.length > 1 or not self.most[r][d].any() or len(fills) != 1:
                continue
            kappa, counts, A, usable, r_long = fills[0]
            # The chunk of one layer (the head, say) holds m of the run's layers, m_j under strategy j: at least
            # N − (v − 1)·κ (the other chunks hold at most κ each), at most κ, and it takes their time.
            most = self.most[r_long][d]
            shared = bld.variables(len(most), 0, most, name=f"end_blocks[run={r},group={d}]")
            m = bld.variables(1, 0, float(most.max()), integer=True, name=f"end_count[run={r},group={d}]")[0]
            bld.row(plus(term(m), term(shared, -1.0)), 0, 0, name=named("end_count", run=r, group=d))
            bld.row(plus(term(shared), term(counts, -1.0)), hi=0, name=named("end_blocks_held", run=r, group=d))
            for j in np.flatnonzero(usable):
                bld.row(plus(term(shared[j]), term(counts[j], -1.0)), hi=0,
                        name=named("end_blocks_of", run=r, group=d, strategy=int(red.runs[r_long].keep[j])))
            bld.row(plus(term(m), term(counts, -1.0), term(kappa, v - 1.0)), 0,
                    name=named("end_blocks_least", run=r, group=d))  # m ≥ N − (v − 1)·κ
            bld.row(plus(term(m), term(kappa, -1.0)), hi=0, name=named("end_blocks_most", run=r, group=d))  # m ≤ κ
            big = float(most.max())
            if self.edges and r in (0, len(red.runs) - 1) and len(red.runs) > 1 and r_long == (1 if r == 0 else r - 1):
                # The chain's first (last) layer shares its chunk with the run only across the edge to it: where
                # that edge is a boundary (on the group holding the layer), m = 0.
                edge = self.Z[d][0 if r == 0 else r - 1]
                bld.row(plus(term(m), term(edge, -big), term(self.N[r][d], big)), hi=big,
                        name=named("end_chunk_layers", run=r, group=d))
            end = self.end_reshard.get(d)
            if end is not None and end[0] == r and end[1] == r_long:  # without edges: m = 0 unless h says shared
                bld.row(plus(term(m), term(end[2], -big)), hi=0, name=named("end_alone_layers", run=r, group=d))
            alone = plus(term(self.N[r][d], red.A[run.first, run.keep] / tau), *self._edges_inside(d, r))
            bld.row(plus(alone, term(shared, A), largest), hi=0, name=named("end_chunk", run=r, group=d))
            at = self._end_chunk(r)
            if at in self.program.group_chunks[d]:
                self.end_blocks[r_long, d] = (list(self.program.group_chunks[d]).index(at), shared)

    def _edges_inside(self, d: int, r: int) -> list[Expr]:
        """Resharding on the edges into and out of single-layer run r where they fall inside one of group d's
        chunks (with edge counts; without them, the end layer's ρ of `add_end_resharding_constraint`)."""
        if not self.edges:
            end = self.end_reshard.get(d)
            return [end[3]] if end is not None and end[0] == r else []
        red, tau = self.reduced, self.scale
        return [term(self.Z[d][q], red.between(q, red.R) / tau) for q in (r - 1, r) if 0 <= q < len(red.runs) - 1]

    def add_memory_constraint(self, bld: Builder, d: int) -> None:
        """Group d's bytes fit its devices at the moment of `program.inflight` (h_k micro-batches in its
        position-k chunk; a moment of its peak, so a valid floor): every layer holds at least min h, the chain's
        single-layer ends the h of the chunk they sit in, and a run's layers add what the least arrangement of
        them over the chunks adds beyond that.

        With at most κ of the run's N layers in a chunk (v·κ ≥ N, `add_slot_constraint`), every chunk holds
        between ℓ = N − (v − 1)·κ and κ of them, so their activations are at least Ma times
        min Σ_k h_k·n_k over Σ n_k = N, ℓ ≤ n_k ≤ κ. That linear program's dual gives one valid row per price λ:

            Σ_k h_k·n_k ≥ λ·N + ℓ·Σ_k (h_k − λ)⁺ − κ·Σ_k (λ − h_k)⁺,

        and the rows for λ at each h_k make it exact (λ = min h: every chunk at least ℓ; λ = max h: the chunks
        holding fewest micro-batches filled first, up to κ). Without them a group could put its layers in its
        emptiest chunk for memory and spread them evenly for time, and the bound's group contents would not fit
        once cut into chunks (Megatron's 145B on 1,536 A100; Nemotron-4 340B's pp8·v7 on 128 H100, where only the
        cap κ showed that 13 blocks do not fit a group whose chunks hold 2)."""
        cap = float(self.program.memory_capacity)
        if not math.isfinite(cap):
            return
        v, red, runs = self.program.virtual_stages, self.reduced, self.reduced.runs
        chunks = list(self.program.group_chunks[d])
        held = self.program.group_inflight[d]
        least = float(held.min())
        prices = [(float(lam) - least, float(np.maximum(held - lam, 0).sum()), float(np.maximum(lam - held, 0).sum()))
                  for lam in np.unique(held)]  # (λ − min h, Σ (h − λ)⁺, Σ (λ − h)⁺)
        parts = []
        for r, run in enumerate(runs):
            at = self._end_chunk(r)
            infl = float(held[chunks.index(at)]) if at in chunks else least
            Ms, Ma = red.Ms[run.first, run.keep], red.Ma[run.first, run.keep]
            parts.append(term(self.N[r][d], (Ms + infl * Ma) / cap))
            kappa = self.kappa.get((r, d))
            if kappa is None or len(prices) == 1:
                continue
            extra = bld.variables(1, 0, name=f"spread_memory[run={r},group={d}]")[0]
            at, shared = self.end_blocks.get((r, d), (None, None))
            for j in np.flatnonzero((self.most[r][d] > 0) & (Ma > 0)):
                unit = float(Ma[j]) / cap  # extra ≥ Ma·(the row above − min h·N); ≤ 0 unless j is used
                if at is None:
                    for i, (above, over, under) in enumerate(prices):
                        bld.row(plus(term(extra), term(self.N[r][d, j], -unit * (above + over)),
                                     term(kappa, unit * ((v - 1) * over + under))), 0,
                                name=named("spread_memory", run=r, group=d, strategy=int(run.keep[j]), price=i))
                    continue
                # The end layer's chunk holds m_j of them: the other v − 1 chunks hold N − m between
                # N − m − (v − 2)·κ and κ each, priced by the same rows over their own h (its own at h_at).
                others = np.delete(held, at)
                for i, lam in enumerate(np.unique(others)):
                    over, under = float(np.maximum(others - lam, 0).sum()), float(np.maximum(lam - others, 0).sum())
                    bld.row(plus(term(extra), term(self.N[r][d, j], -unit * (lam - least + over)),
                                 term(shared[j], -unit * (float(held[at]) - lam - over)),
                                 term(kappa, unit * ((v - 2) * over + under))), 0,
                            name=named("spread_memory_end", run=r, group=d, strategy=int(run.keep[j]), price=i))
            parts.append(term(extra))
        bld.row(plus(*parts), hi=1.0, name=named("memory", group=d))

    def _end_chunk(self, r: int) -> int | None:
        """The chunk a single-layer run at an end of the chain sits in (the first chunk, or the last), else None."""
        runs = self.reduced.runs
        if runs[r].length > 1 or len(runs) < 2:
            return None
        return 0 if r == 0 else self.program.stages - 1 if r == len(runs) - 1 else None

    def contents(self, x: np.ndarray) -> list[np.ndarray]:
        """The group contents of a point: per run, counts (P, K_r) over the run's kept strategies."""
        return [np.rint(x[n]).astype(int) for n in self.N]


def chain_plan(program: StageProgram, reduced: Reduced, counts: list[np.ndarray],
               attained: float = 0.0) -> tuple[tuple[np.ndarray, np.ndarray] | None, float]:
    """(plan, its TPI): a plan built directly (no MILP) that holds the given group contents, or nearly; None when
    none can be built (TPI inf). Each group cuts its layers into its v chunks one of eleven ways (`_group_cuts`):
    its layers listed in chain order, a run's layers class by class (the most numerous class first, or last),
    then cut where the run or the class changes (so resharding becomes a send) and then single layers off its
    end; single layers off its end only (one long chunk); into chunks of near-equal time (what the slot term
    rewards); or into those chunks with the lengths of a kind's swapped to hold the fewest activation bytes at
    the group's peak (what memory rewards), the chain's single-layer ends in chunks of their own or not; or its
    blocks packed into chunks of near-equal time (`_packed`). Chunk j is then group j mod P's next piece.

    The groups choose apart: from the best plan whose groups all cut one way, each group in turn takes the cut
    that lowers the TPI with the others held, until none does or a plan's TPI is at most `attained` (a proven
    bound: nothing better exists). Plans that do not fit rank by how far their fullest group overflows. Then,
    short of `attained`, a group holding an end layer of the chain (the embedding, the head) may also run it
    under a strategy of fewer bytes, and the descent goes on. On Nemotron-4 340B fp8 on 128 H100 (pp8·v6) the
    first group keeps the embedding beside a block and the last puts the head alone: no single way gives both,
    and the chunk MILP took 8.5 s to find the plan that attains the group bound. On Llama 3.1 70B on 2,048 H100
    (pp2·v8) the embedding strategy of the bound's contents (which prices the group's bytes at one moment of the
    schedule) fits in no cut; another one does."""
    P = program.pipeline_degree
    options = [[_group_cuts(program, reduced, counts, d)] for d in range(P)]

    def merit(choice):
        plan = _assemble(program, reduced, [options[d][e][w] for d, (e, w) in enumerate(choice)])
        if plan is None:
            return plan, (math.inf, math.inf)
        value = evaluate(program, *plan)
        if math.isfinite(value):
            return plan, (0.0, value)
        overflow = float(stage_times(program, *plan).memory.max()) / float(program.memory_capacity)
        return plan, (overflow if math.isfinite(overflow) else math.inf, math.inf)

    best, rank, choice = None, (math.inf, math.inf), None
    for w in range(len(options[0][0])):
        plan, trial = merit([(0, w)] * P)
        if trial < rank:
            best, rank, choice = plan, trial, [(0, w)] * P
    if choice is None:
        return None, math.inf
    best, rank, choice = _descend(options, merit, best, rank, choice, attained)
    if rank[0] > 0 or rank[1] > attained:
        for d in range(P):
            options[d] += _end_strategy_options(program, reduced, counts, d)
        best, rank, choice = _descend(options, merit, best, rank, choice, attained)
    return (best, rank[1]) if rank[0] == 0 else (None, math.inf)


def _descend(options, merit, best, rank, choice, attained: float):
    """`chain_plan`'s descent: each group in turn takes the option (its contents `options[d][e]` cut the way w)
    that improves the merit (overflow, TPI), until none does or the TPI is at most `attained`."""
    improved = True
    while improved and not (rank[0] == 0 and rank[1] <= attained):
        improved = False
        for d, group in enumerate(options):
            tried = {_key(group[choice[d][0]][choice[d][1]])}
            for e, cuts in enumerate(group):
                for w, pieces in enumerate(cuts):
                    if pieces is None or _key(pieces) in tried:
                        continue
                    tried.add(_key(pieces))
                    trial = choice[:d] + [(e, w)] + choice[d + 1:]
                    plan, value = merit(trial)
                    if value[0] < rank[0] or (value[0] == rank[0] and value[1] < rank[1] * (1 - 1e-12)):
                        best, rank, choice, improved = plan, value, trial, True
                        if rank[0] == 0 and rank[1] <= attained:
                            return best, rank, choice
    return best, rank, choice


def _end_strategy_options(program: StageProgram, reduced: Reduced, counts: list[np.ndarray], d: int) -> list[list]:
    """Group d's cuts (`_group_cuts`) of its contents with an end layer of the chain it holds under each other
    strategy of that layer that no other beats in time, sync and bytes (A, G, Ms, Ma) and that holds fewer static
    or activation bytes than the contents', the END_STRATEGIES fastest of them (the bounds price a group's bytes
    at one moment of the schedule, so a cut may need a lighter end layer than their contents hold): a
    layer of a run of one, identical to no other layer (a group runs a stretch of identical layers under one
    strategy: solve.reduce)."""
    options = []
    stretched = {r for _, covering in reduced.shared() for r in covering}
    for r in sorted({0, len(reduced.runs) - 1} - stretched):
        run = reduced.runs[r]
        if run.length > 1 or not counts[r][d].any():
            continue
        now = int(np.argmax(counts[r][d]))
        Ms, Ma = reduced.kept(r, reduced.Ms), reduced.kept(r, reduced.Ma)
        lighter = np.flatnonzero(_any_class_undominated(reduced, run) & ((Ms < Ms[now]) | (Ma < Ma[now])))
        for j in lighter[np.argsort(reduced.kept(r, reduced.A)[lighter], kind="stable")][:END_STRATEGIES]:
            other = [held.copy() for held in counts]
            other[r][d] = 0
            other[r][d, j] = 1
            options.append(_group_cuts(program, reduced, other, d))
    return options


def _key(pieces: list[list[tuple]] | None) -> tuple:
    """A group's cut as a hashable value (two ways that give the same chunks are tried once)."""
    return () if pieces is None else tuple(map(tuple, pieces))


def _assemble(program: StageProgram, reduced: Reduced,
              pieces: list[list[list[tuple]] | None]) -> tuple[np.ndarray, np.ndarray] | None:
    """The plan whose chunk j is group j mod P's piece j // P (labels (run, class, strategy)), or None where a group
    has no cut or an empty chunk, or the groups' runs do not line up along the chain this way."""
    P, v = program.pipeline_degree, program.virtual_stages
    if any(group is None or not all(group) for group in pieces):
        return None
    chain = [(k * P + d, label) for k in range(v) for d in range(P) for label in pieces[d][k]]
    if len(chain) != program.layers or any(label[0] != reduced.run_of[u] for u, (_, label) in enumerate(chain)):
        return None
    return np.array([j for j, _ in chain]), np.array([label[2] for _, label in chain])


def _group_cuts(program: StageProgram, reduced: Reduced, counts: list[np.ndarray], d: int) -> list:
    """Group d's eleven cuts of its contents into v chunks (`chain_plan`), each a list of v pieces of labels
    (run, class, strategy), or None where that way cannot cut them."""
    cuts = [_cut(program, reduced, counts, d, most_first, how)
            for most_first in (True, False) for how in ("changes", "tail", "balanced", "memory", "alone")]
    return cuts + [_packed(program, reduced, counts, d)]


def _packed(program: StageProgram, reduced: Reduced, counts: list[np.ndarray], d: int) -> list | None:
    """Group d's chunks packed to near-equal time: when the chain is one run of several layers (the blocks)
    between single layers (the embedding on chunk 0, the head on the last chunk), the blocks' order inside the
    run is free, so the group deals its blocks, slowest first, to its least loaded chunk (LPT), its single layers
    fixed in its first and last chunks; a chunk lists its layers in chain order, its blocks by layout class.
    None when the chain has another shape or a chunk is left empty."""
    v, runs = program.virtual_stages, reduced.runs
    long = [r for r, run in enumerate(runs) if run.length > 1]
    if len(long) != 1 or any(run.length > 1 for run in runs[:long[0]]) or len(runs) - long[0] > 2:
        return None
    body = long[0]
    chunks = [[] for _ in range(v)]
    for r, run in enumerate(runs):
        if r != body and counts[r][d].any():
            j = int(np.argmax(counts[r][d]))
            chunks[0 if r < body else v - 1].append((r, int(run.cls[j]), int(run.keep[j])))
    run = runs[body]
    A = reduced.A[run.first]
    load = [sum(float(reduced.A[runs[r].first, k]) for r, _, k in piece) for piece in chunks]
    blocks = sorted(((j, int(k)) for j, k in enumerate(run.keep) for _ in range(int(counts[body][d, j]))),
                    key=lambda block: -A[block[1]])
    for j, k in blocks:
        target = int(np.argmin(load))
        chunks[target].append((body, int(run.cls[j]), k))
        load[target] += float(A[k])
    if not all(chunks):
        return None
    return [sorted(piece) for piece in chunks]


def _cut(program: StageProgram, reduced: Reduced, counts: list[np.ndarray], d: int, most_first: bool,
         how: str) -> list | None:
    """Group d's layers in chain order (a run's class by class, the most numerous first or last) cut into v
    pieces the way `how` says (`chain_plan`); None where it cannot."""
    v, runs = program.virtual_stages, reduced.runs
    labels = []  # (run, class, strategy) of the group's layers in chain order
    for r, (run, held) in enumerate(zip(runs, counts)):
        present = np.flatnonzero(held[d])
        if not len(present):
            continue
        per_class = np.bincount(run.cls, weights=held[d], minlength=run.classes)
        rank = np.argsort(np.argsort(-per_class if most_first else per_class, kind="stable"))
        for j in sorted(present, key=lambda j: (rank[run.cls[j]], j)):
            labels += [(r, int(run.cls[j]), int(run.keep[j]))] * int(held[d, j])
    if len(labels) < v:
        return None
    if how in ("balanced", "memory", "alone"):
        times = [float(reduced.A[runs[r].first, k]) for r, _, k in labels]
        # "alone": the chain's single-layer ends (embedding, head) in chunks of their own, the rest balanced
        first = int(how == "alone" and labels[0][0] == 0 and runs[0].length == 1)
        last = int(how == "alone" and labels[-1][0] == len(runs) - 1 and runs[-1].length == 1 and len(runs) > 1)
        if len(labels) - first - last < v - first - last or v - first - last < 1:
            return None
        inner = _balanced_cuts(times[first:len(labels) - last], v - first - last)
        edges = [0] * first + [first + e for e in inner] + [len(labels)] * last
    else:
        changes = [i for i in range(1, len(labels)) if labels[i][:2] != labels[i - 1][:2]]
        cuts = set(changes[:v - 1]) if how == "changes" else set()
        tail = len(labels) - 1
        while len(cuts) < v - 1:  # more chunks than changes: single layers off the end
            cuts.add(tail)
            tail -= 1
        edges = [0, *sorted(cuts), len(labels)]
    pieces = [labels[a:b] for a, b in zip(edges[:-1], edges[1:])]
    if how in ("memory", "alone"):
        Ma = {label: float(reduced.Ma[runs[label[0]].first, label[2]]) for label in labels}
        pieces = _least_held_order(pieces, program.group_moments[d], Ma)
    return pieces


def _least_held_order(pieces: list[list[tuple]], patterns: np.ndarray, Ma: dict) -> list[list[tuple]]:
    """A group's chunks with the lengths of those of one repeated layer kind (one label) swapped among them so that
    the most activation bytes it holds at any moment of `patterns` (micro-batches per chunk position, one row per
    moment) is least: the same layers and time per chunk kind. Swaps of two lengths, while one lowers the peak
    (v ≤ 8 chunks: a few dozen evaluations). `Ma`: activation bytes per label."""
    out = [list(piece) for piece in pieces]
    kinds: dict[tuple, list[int]] = {}
    for k, piece in enumerate(pieces):
        if piece and all(label == piece[0] for label in piece):
            kinds.setdefault(piece[0], []).append(k)

    def peak(chunks):
        return float((patterns @ np.array([sum(Ma[label] for label in piece) for piece in chunks])).max())

    best = peak(out)
    improved = True
    while improved:
        improved = False
        for label, positions in kinds.items():
            for i, a in enumerate(positions):
                for b in positions[i + 1:]:
                    if len(out[a]) == len(out[b]):
                        continue
                    trial = list(out)
                    trial[a], trial[b] = out[b], out[a]
                    value = peak(trial)
                    if value < best:
                        out, best, improved = trial, value, True
    return out


def _balanced_cuts(times: list[float], v: int) -> list[int]:
    """Boundaries 0 = e_0 < … < e_v = n cutting `times` into v non-empty pieces of near-equal sums: each cut at
    the layer boundary nearest to k/v of the total."""
    n = len(times)
    before = np.concatenate([[0.0], np.cumsum(times)])
    edges = [0]
    for k in range(1, v):
        target = before[-1] * k / v
        lo, hi = edges[-1] + 1, n - (v - k)  # leave a layer for this piece and each one after it
        edges.append(lo + int(np.argmin(np.abs(before[lo:hi + 1] - target))))
    return edges + [n]


def _chain_ends(reduced: Reduced, groups: int) -> list[tuple[int, int, int, int, bool]]:
    """The chain's single-layer ends that may reshard from their neighbour: (group, end run, neighbouring run, the
    edge between them, whether the end is the edge's source): the first layer on group 0, the last on P − 1."""
    runs, ends = reduced.runs, []
    if len(runs) > 1 and runs[0].length == 1:
        ends.append((0, 0, 1, runs[0].last, True))
    if len(runs) > 1 and runs[-1].length == 1:
        ends.append((groups - 1, len(runs) - 1, len(runs) - 2, runs[-2].last, False))
    return [(d, r_end, r_next, edge, source) for d, r_end, r_next, edge, source in ends
            if _end_resharding(reduced, edge, source)[np.ix_(runs[r_end].keep, runs[r_next].keep)].any()]


def _end_resharding(reduced: Reduced, edge: int, source: bool) -> np.ndarray:
    """R at a chain end's edge as (end layer's strategy, neighbour's strategy), over strategy ids."""
    return reduced.R[edge] if source else reduced.R[edge].T


def _any_class_undominated(reduced: Reduced, run, extra: list[np.ndarray] = ()) -> np.ndarray:
    """Mask over run.keep: strategies no other one beats in A, G, Ms and Ma (and the `extra` rows over strategy
    ids), whatever its layout class."""
    return undominated(run.keep, np.zeros(len(run.keep), dtype=int),
                       [t[run.first] for t in (reduced.A, reduced.G, reduced.Ms, reduced.Ma)] + list(extra))
