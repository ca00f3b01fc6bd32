"""The solver: numpy cost tables in (`uniap.program.StageProgram`, which the cost model fills), a plan (stage and
strategy per layer) out. Imports no torch.

program.py      Solution, `evaluate` — the one TPI formula — and the bounds of a StageProgram
reference.py    brute-force oracle for tiny programs (the tests' ground truth)
reduce.py       folding of identical layers, layout classes, dominated strategies
formulation.py  the exact MILP over folded runs (one add_<kind>_constraint per kind of row), plan <-> point maps,
                sub-tour cuts
linear.py       solver-neutral sparse MILP, every row named by meaning; backends.py: HiGHS and Gurobi behind one
                interface, HiGHS's irreducible infeasible subset
quadratic.py    the native quadratic form for SCIP
bounds.py       DP partition bound (prunes candidates before any MILP)
guesses.py      plans built by rules (uniform; stagewise for v = 1): the search's and the MILP's first incumbents
group_relaxation.py  interleaved programs by device group: a small MILP that bounds them, plans built from it
milp.py         `solve(program, solver=..., time_limit=..., cutoff=..., fold=..., mip_gap=..., explain=...)`;
                `explain_infeasible(program)`: one line naming the kinds of rows that conflict
uop.py          `search(candidates, build, ...)`: the unified optimisation process over configurations
"""
