"""The house rules the README's layout states, read off the source: short functions, and the imports that keep
data flowing one way (every import counts, those inside functions too)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "uniap"
LONGEST = 100
"""Lines of the longest function or method in src/ (docstring included)."""


def _trees():
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _imported(tree: ast.AST) -> set[str]:
    """Every module a file imports, at any depth ("from uniap import x" counts as uniap.x)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            if node.module == "uniap":
                out |= {f"uniap.{alias.name}" for alias in node.names}
    return out


def test_no_function_in_src_is_over_100_lines():
    long = [f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree in _trees() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONGEST]
    assert not long, "over 100 lines: " + ", ".join(long)


@pytest.mark.parametrize("package, forbidden", [
    ("solve", ("torch", "uniap.runtime", "uniap.cost", "uniap.profile")),  # the solver reads flat arrays only
    ("runtime", ("uniap.solve", "uniap.planner", "uniap.cost")),  # the runtime runs a plan; it never plans
    ("cost", ("uniap.profile", "uniap.solve", "uniap.runtime", "torch")),  # measured figures come as a CostSource
    ("profile", ("uniap.solve", "uniap.estimate", "uniap.planner", "uniap.plans", "uniap.intervals")),  # it measures
    # and calibrates; a plan's interval is costed above it (uniap.intervals)
])
def test_a_package_never_imports_what_lies_downstream_of_it(package, forbidden):
    found = [f"{path.relative_to(SRC)} imports {module}" for path, tree in _trees()
             if path.relative_to(SRC).parts[0] == package for module in sorted(_imported(tree))
             if any(module == f or module.startswith(f + ".") for f in forbidden)]
    assert not found, "; ".join(found)
