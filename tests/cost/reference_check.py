"""The MILP against the enumeration oracle on one real program, at its own memory capacity and a tighter one."""

import dataclasses

import pytest

from uniap.solve.milp import solve
from uniap.solve.program import evaluate
from uniap.solve.reference import solve_reference


def assert_milp_equals_reference(program, tight_capacity: float) -> None:
    """Same optimum as enumeration (or both infeasible), and an objective `evaluate` confirms."""
    for capacity in (program.memory_capacity, tight_capacity):
        prog = dataclasses.replace(program, memory_capacity=capacity)
        reference, found = solve_reference(prog), solve(prog)
        if reference is None:
            assert found is None
            continue
        assert found.objective == pytest.approx(reference.objective, rel=1e-6)
        assert found.objective == pytest.approx(evaluate(prog, found.stage_of, found.strategy_of), rel=1e-9)
