"""uniap: find the fastest way to train a transformer on a cluster (UniAP's MIQP), then train it that way.

    import uniap
    plan = uniap.plan("llama2-7b", cluster="a100-80g:2x8", global_batch=512, seq_len=4096)
    model = uniap.parallelize(hf_model, plan)    # on every rank, under torchrun (see README, "Use it from Python")

Names are imported on first use, so `import uniap` pulls in neither torch nor the solver.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["ParallelModel", "Plan", "UniapError", "parallelize", "plan"]


def __getattr__(name: str):
    if name in ("plan", "parallelize"):
        from uniap import api

        return getattr(api, name)
    if name == "Plan":
        from uniap.plans import Plan

        return Plan
    if name == "ParallelModel":
        from uniap.runtime.parallel_model import ParallelModel

        return ParallelModel
    if name == "UniapError":
        from uniap.errors import UniapError

        return UniapError
    raise AttributeError(f"module 'uniap' has no attribute {name!r}")
