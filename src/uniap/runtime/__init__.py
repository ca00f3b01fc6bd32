"""Runs a Plan on PyTorch distributed (torchrun; gloo on CPU, NCCL on GPU).

Public entry points (imported lazily, so `import uniap.runtime` pulls in no torch):
    run(plan_path, *, nproc, timeout_s, nodes, **TrainingJob fields)
    run_many(jobs: list[TrainingJob], *, nproc, timeout_s, nodes)   several plans in one torchrun launch
    uniform_plan(config, world, ...)         hand-built plans (tests, planner-less runs)
The runtime sees only the Plan and the model; it imports nothing from `uniap.solve`.
"""

from __future__ import annotations

__all__ = ["run", "run_many", "uniform_plan"]


def __getattr__(name: str):
    if name in ("run", "run_many"):
        from uniap.runtime import launch

        return getattr(launch, name)
    if name == "uniform_plan":
        from uniap.runtime.plans import uniform_plan

        return uniform_plan
    raise AttributeError(f"module 'uniap.runtime' has no attribute {name!r}")
