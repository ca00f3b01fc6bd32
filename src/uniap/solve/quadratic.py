"""UniAP's MIQP in its native quadratic form, for SCIP: an independent formulation to cross-check the MILP.

x[u,k] strategy one-hot, q[u,i] = "layer u is on a stage ≤ i" (so y[u,i] = q[u,i] − q[u,i−1] places layer u and
q[u,i] − q[u+1,i] marks a stage boundary after u), e[u,k,k'] = x[u,k]·x[u+1,k'] through Alpa's marginals.
Stage terms are products of a linear expression in q with one in x or e — quadratic, as SCIP takes them — and sit
under epigraph variables p, o, g, B, H so the objective stays linear (SCIP wants that of a nonlinear model).
Not folded: meant for small programs.
"""

from __future__ import annotations

import math

import numpy as np

from uniap.program import StageProgram


class ScipQuadratic:
    """The quadratic model of one program in PySCIPOpt, ready to solve."""

    def __init__(self, program: StageProgram, scale: float):
        import pyscipopt as scip

        self._scip = scip
        self.program = program
        P, L, K = program.stages, program.layers, program.strategies
        ok = np.asarray(program.allowed, dtype=bool)
        pair_ok = ok[:-1, :, None] & ok[1:, None, :]
        A, G, Ms, Ma = (np.where(ok, np.asarray(t, dtype=float), 0.0) for t in (program.A, program.G, program.Ms,
                                                                                program.Ma))
        R, Rp = (np.where(pair_ok, np.asarray(t, dtype=float), 0.0) / scale for t in (program.R, program.Rp))
        A, G = A / scale, G / scale
        m = scip.Model()
        m.hideOutput()
        self._m = m
        x = [[m.addVar(vtype="B", ub=1.0 if ok[u, k] else 0.0) for k in range(K)] for u in range(L)]
        q = [[m.addVar(vtype="B") for _ in range(P)] for _ in range(L)]
        e = [[[m.addVar(lb=0.0, ub=1.0) for _ in range(K)] for _ in range(K)] for _ in range(L - 1)]
        self._x, self._q = x, q
        qsum = scip.quicksum
        for u in range(L):
            m.addCons(qsum(x[u]) == 1)
            m.addCons(q[u][P - 1] == 1)
            for i in range(P - 1):
                m.addCons(q[u][i] <= q[u][i + 1])
            if u + 1 < L:
                for i in range(P):
                    m.addCons(q[u + 1][i] <= q[u][i])
                for k in range(K):
                    m.addCons(qsum(e[u][k]) == x[u][k])
                    m.addCons(qsum(e[u][j][k] for j in range(K)) == x[u + 1][k])
        m.addCons(q[0][0] == 1)

        def on(u, i):  # layer u on stage i
            return q[u][i] - (q[u][i - 1] if i > 0 else 0)

        for i in range(P):
            m.addCons(qsum(on(u, i) for u in range(L)) >= 1)
        p = [m.addVar(lb=0.0) for _ in range(P)]
        o = [m.addVar(lb=0.0) for _ in range(P - 1)]
        B, H = m.addVar(lb=0.0), m.addVar(lb=0.0)
        cap = float(program.memory_capacity)
        infl = np.asarray(program.inflight, dtype=float)
        for i in range(P):
            compute = qsum(on(u, i) * qsum(A[u, k] * x[u][k] for k in range(K)) for u in range(L))
            # u and u+1 both on stage i: u is on it and no boundary at stage i follows u
            inner = qsum((on(u, i) - (q[u][i] - q[u + 1][i])) * _pair(qsum, R[u], e[u]) for u in range(L - 1))
            m.addCons(p[i] >= compute + inner)
            m.addCons(H >= qsum(on(u, i) * qsum(G[u, k] * x[u][k] for k in range(K)) for u in range(L)))
            if math.isfinite(cap):
                mem = (Ms + infl[i] * Ma) / cap
                m.addCons(qsum(on(u, i) * qsum(mem[u, k] * x[u][k] for k in range(K)) for u in range(L)) <= 1.0)
            if i + 1 < P:
                m.addCons(o[i] >= qsum((q[u][i] - q[u + 1][i]) * _pair(qsum, Rp[u], e[u]) for u in range(L - 1)))
                m.addCons(B >= o[i])
        for i in range(P):  # the steady state: B ≥ p_i + (o_{i−1} + o_i)/2 (solve.program)
            m.addCons(B >= p[i] + (o[i - 1] / 2 if i > 0 else 0.0) + (o[i] / 2 if i < P - 1 else 0.0))
        m.setObjective(qsum(p) + qsum(o) + (program.micro_batches - 1) * B + H, "minimize")

    def solve(self, time_limit: float | None, cutoff: float | None, mip_gap: float):
        """(status, (stage_of, strategy_of) or None, lower bound), status as in backends.MipResult."""
        m = self._m
        if time_limit is not None:
            m.setParam("limits/time", max(float(time_limit), 0.0))
        if cutoff is not None:
            m.setObjlimit(float(cutoff))
        m.setParam("limits/gap", float(mip_gap))
        m.optimize()
        status = m.getStatus()
        plan = None
        if m.getNSols() > 0:
            sol = m.getBestSol()
            P = self.program.stages
            stage_of = np.array([P - int(round(sum(m.getSolVal(sol, v) for v in row))) for row in self._q])
            strategy_of = np.array([int(np.argmax([m.getSolVal(sol, v) for v in row])) for row in self._x])
            plan = (stage_of, strategy_of)
        if status == "optimal":
            return "optimal", plan, float(m.getDualbound())
        if status in ("infeasible", "inforunbd"):
            return "infeasible", None, math.inf
        return "limit", plan, float(m.getDualbound())


def _pair(qsum, cost: np.ndarray, e) -> object:
    K = cost.shape[0]
    return qsum(cost[k, j] * e[k][j] for k in range(K) for j in range(K) if cost[k, j])
