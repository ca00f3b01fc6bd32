"""Linear MILP back-ends behind one small interface: load a LinearModel, add rows, solve with limits."""

from __future__ import annotations

import ctypes
import math
import os
import sys
from dataclasses import dataclass

import numpy as np

from uniap.errors import UniapError
from uniap.solve.linear import LinearModel, Row, RowName, csr

ABS_GAP = 1e-9
"""Absolute MIP gap on the scaled objective (≳ 1): small enough that the relative gap decides."""


HIGHS_ACCURACY = {"primal_feasibility_tolerance": 1e-9, "mip_feasibility_tolerance": 1e-9}
"""The bottleneck row B >= p_i enters the objective multiplied by c - 1 (up to hundreds of micro-batches), so a row
met only to the default 1e-6 feasibility tolerance under-states the TPI by (c - 1)·1e-6 of the scale: enough to
miss a proof of optimality by 1e-4. Tighter tolerances keep the MILP's objective equal to evaluate() of the plan."""

HIGHS_SPEED = {
    "mip_pscost_minreliable": 2,  # fewer strong-branching probes per variable before trusting pseudo-costs
    # On the folded programs the root is dominated by sub-MIP heuristics and a restart once presolve has fixed
    # columns; without them the same proofs come about twice as fast (the UOP's cut-off prunes in their stead).
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_heuristic_run_root_reduced_cost": False,
    "mip_allow_restart": False,
}
"""Options that only change how fast HiGHS proves optimality: over the 30 programs of 5 zoo cases in
`benchmarks/search_scaling.py --only options` they took 28 s against 52 s with HiGHS's defaults."""

HIGHS_SMALL = {**HIGHS_SPEED, "presolve": "off"}
"""For the coarse device-group relaxation (group_relaxation.py, a few hundred columns): presolve costs more than
it saves there. On six GPT-1T / 3,072-GPU programs, cut off at the optimum, 0.07–0.24 s each instead of
0.12–0.75 s (with edge counts presolve pays: 0.39 s instead of 0.56 s)."""

IIS_TIME_S = 10.0
"""How long HiGHS may look for an irreducible infeasible subset (it solves a sub-MIP per row it tries to drop)."""

_threads: int | None = None


def limit_threads(count: int) -> None:
    """Cap HiGHS's threads in this process (solver worker processes use 1: the pool already fills the cores).
    Takes effect for HiGHS instances made afterwards, before HiGHS first runs in the process."""
    global _threads
    _threads = count


@dataclass(frozen=True)
class MipResult:
    status: str  # "optimal" | "limit" (stopped early) | "infeasible" (no point, or none below the cutoff)
    #              | "target" (stopped at a point at most the `target` asked for)
    x: np.ndarray | None  # best point found, if any
    bound: float  # proven lower bound on the objective (-inf when unknown)


class HighsBackend:
    """HiGHS through highspy, model passed as arrays (fast: no per-variable Python objects)."""

    def __init__(self, model: LinearModel, options: dict | None = None):
        """`options` replaces HIGHS_SPEED (the benchmark compares them with HiGHS's defaults, `{}`)."""
        import highspy

        self._highspy = highspy
        self._h = _quiet_highs(highspy)
        h = self._h
        h.setOptionValue("output_flag", False)
        if _threads is not None:
            h.setOptionValue("threads", _threads)
        for name, value in {**HIGHS_ACCURACY, **(HIGHS_SPEED if options is None else options)}.items():
            h.setOptionValue(name, value)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = model.columns, model.rows
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = model.cost, model.lb, model.ub
        lp.row_lower_, lp.row_upper_ = model.row_lo, model.row_hi
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = model.columns, model.rows
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = model.start, model.index, model.value
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in model.integer]
        _check(h.passModel(lp), "load the model", highspy)
        self._names: list[RowName] = list(model.names)
        self._model = model

    def add_rows(self, rows: list[Row]) -> None:
        """Named rows (expression, lo, hi, name) added to the loaded model."""
        if not rows:
            return
        self._names += [r[3] for r in rows]
        start, index, value = csr([r[0] for r in rows])
        lo = np.array([r[1] for r in rows], dtype=float)
        hi = np.array([r[2] for r in rows], dtype=float)
        _check(self._h.addRows(len(rows), lo, hi, len(index), start[:-1].astype(np.int32), index.astype(np.int32),
                               value), "add rows", self._highspy)

    def solve(self, time_limit: float | None, cutoff: float | None, mip_gap: float,
              target: float | None = None) -> MipResult:
        """`cutoff`: look only for points below it (none: "infeasible"). `target`: stop at the first point whose
        objective is at most it (a caller that knows the bound a point at it would attain). No start point: the
        caller passes the plan it holds as the cutoff instead (HiGHS, given a start at its objective bound, can
        stop "optimal" at the start with its root bound as the dual bound)."""
        h, hs = self._h, self._highspy
        h.setOptionValue("time_limit", float(time_limit) if time_limit is not None else math.inf)
        h.setOptionValue("objective_bound", float(cutoff) if cutoff is not None else math.inf)
        h.setOptionValue("objective_target", float(target) if target is not None else -math.inf)
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        h.setOptionValue("mip_abs_gap", ABS_GAP)
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        has_point = info.primal_solution_status == hs.kSolutionStatusFeasible
        x = np.array(h.getSolution().col_value) if has_point else None
        M = hs.HighsModelStatus
        if status == M.kOptimal:
            return MipResult("optimal", x, float(info.mip_dual_bound))
        if status in (M.kInfeasible, M.kObjectiveBound):
            return MipResult("infeasible", None, math.inf)
        if status == M.kObjectiveTarget and x is not None:
            return MipResult("target", x, float(info.mip_dual_bound))
        if status in (M.kTimeLimit, M.kInterrupt, M.kIterationLimit, M.kSolutionLimit, M.kMemoryLimit,
                      M.kHighsInterrupt):
            return MipResult("limit", x, float(info.mip_dual_bound))
        raise UniapError(f"HiGHS stopped with status '{h.modelStatusToString(status)}'")

    def conflict(self, time_limit: float | None = IIS_TIME_S) -> tuple[list[RowName], list[str]] | None:
        """An irreducible infeasible subset of the loaded (infeasible) model, as HiGHS finds it: the names of its
        rows, in row order, and the variable family of each column whose bounds take part. None where HiGHS finds
        none (it cannot prove one, the time limit stops it, or the model is feasible)."""
        h, hs = self._h, self._highspy
        try:
            h.setOptionValue("time_limit", float(time_limit) if time_limit is not None else math.inf)
            h.setOptionValue("iis_strategy", int(hs.IisStrategy.kIisStrategyIrreducible))
            status, iis = h.getIis()
        except (AttributeError, TypeError, RuntimeError):  # a highspy without IIS for MIPs
            return None
        if status == hs.HighsStatus.kError or not iis.valid_:
            return None
        rows, cols = sorted(int(i) for i in iis.row_index_), sorted(int(j) for j in iis.col_index_)
        if not rows and not cols:
            return None
        names = [self._names[i] if i < len(self._names) else ("unnamed", ()) for i in rows]
        return names, [self._model.family(j) if self._model.families else "unnamed" for j in cols]


class GurobiBackend:
    """Gurobi through gurobipy (optional; used only when importable and licensed)."""

    def __init__(self, model: LinearModel):
        import gurobipy as gp

        self._gp = gp
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 0)
        env.start()
        self._env = env
        m = gp.Model(env=env)
        vtype = [gp.GRB.INTEGER if i else gp.GRB.CONTINUOUS for i in model.integer]
        self._x = m.addVars(model.columns, lb=model.lb.tolist(), ub=model.ub.tolist(), obj=model.cost.tolist(),
                            vtype=vtype)
        self._vars = [self._x[j] for j in range(model.columns)]
        self._m = m
        for i in range(model.rows):
            lo, hi = model.row_lo[i], model.row_hi[i]
            span = slice(model.start[i], model.start[i + 1])
            self._add(model.index[span], model.value[span], lo, hi)
        m.update()

    def _add(self, index, value, lo, hi) -> None:
        gp = self._gp
        expr = gp.LinExpr(value.tolist(), [self._vars[j] for j in index])
        if lo == hi:
            self._m.addLConstr(expr, gp.GRB.EQUAL, lo)
            return
        if math.isfinite(lo):
            self._m.addLConstr(expr, gp.GRB.GREATER_EQUAL, lo)
        if math.isfinite(hi):
            self._m.addLConstr(expr, gp.GRB.LESS_EQUAL, hi)

    def add_rows(self, rows: list[Row]) -> None:
        start, index, value = csr([r[0] for r in rows])
        for i, (_, lo, hi, _) in enumerate(rows):
            self._add(index[start[i]:start[i + 1]], value[start[i]:start[i + 1]], lo, hi)
        self._m.update()

    def solve(self, time_limit: float | None, cutoff: float | None, mip_gap: float,
              target: float | None = None) -> MipResult:
        gp, m = self._gp, self._m
        m.Params.BestObjStop = float(target) if target is not None else -gp.GRB.INFINITY
        m.Params.TimeLimit = float(time_limit) if time_limit is not None else gp.GRB.INFINITY
        m.Params.Cutoff = float(cutoff) if cutoff is not None else gp.GRB.INFINITY
        m.Params.MIPGap = float(mip_gap)
        m.Params.MIPGapAbs = ABS_GAP
        try:
            m.optimize()
        except gp.GurobiError as exc:  # e.g. a size-limited licence
            raise UniapError(f"Gurobi failed: {exc}") from None
        G = gp.GRB
        x = np.array([v.X for v in self._vars]) if m.SolCount > 0 else None
        if m.Status == G.OPTIMAL:
            return MipResult("optimal", x, float(m.ObjBound))
        if m.Status in (G.INFEASIBLE, G.INF_OR_UNBD, G.CUTOFF):
            return MipResult("infeasible", None, math.inf)
        if m.Status == G.USER_OBJ_LIMIT and x is not None:
            return MipResult("target", x, float(m.ObjBound))
        if m.Status in (G.TIME_LIMIT, G.INTERRUPTED, G.NODE_LIMIT, G.SOLUTION_LIMIT, G.ITERATION_LIMIT):
            return MipResult("limit", x, float(m.ObjBound) if m.SolCount > 0 else -math.inf)
        raise UniapError(f"Gurobi stopped with status {m.Status}")


_banner_shown = False


def _quiet_highs(highspy):
    """A Highs instance without the banner HiGHS prints on stdout when the first one is made in a process
    (before any option can turn output off): stdout's file descriptor points at /dev/null meanwhile."""
    global _banner_shown
    if _banner_shown:
        return highspy.Highs()
    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    libc.fflush(None)
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            h = highspy.Highs()
            libc.fflush(None)  # C stdio may hold the banner in its buffer: drop it into /dev/null now
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        _banner_shown = True
    return h


def _check(status, what: str, highspy) -> None:
    if status == highspy.HighsStatus.kError:
        raise UniapError(f"HiGHS could not {what}")
