"""Measured costs: `uniap profile` (measure) and the calibration of the cost model with them.

    from uniap.profile import calibrate, load_profile, profile_model
    doc = profile_model(config, seq_len, nproc=4)              # spawns torchrun; needs torch
    cluster = calibrate(cluster, "profile.json", model=model, workload=workload)   # torch-free
    plan_search(model, cluster, workload)                       # costs now come from the measurements

Modules: `items` (what is measured), `harness`/`worker` (the measuring ranks, torch), `collect` (driver and
assembly of the file), `schema` (file format, validation), `fit` (line and α–β fits), `calibration` (what the
cost tables ask). `uniap.demo`, above the planner and the runtime, uses them. Importing this package pulls in no
torch.
"""

from __future__ import annotations

from uniap.profile.calibration import calibrate
from uniap.profile.schema import SCHEMA, load_profile

__all__ = ["SCHEMA", "calibrate", "load_profile", "profile_model"]


def __getattr__(name: str):
    if name == "profile_model":
        from uniap.profile.collect import profile_model

        return profile_model
    raise AttributeError(f"module 'uniap.profile' has no attribute {name!r}")
