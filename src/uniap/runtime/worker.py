"""The per-rank entry point torchrun starts: `python -m uniap.runtime.worker PAYLOAD.json OUT_DIR`.

PAYLOAD.json: {"jobs": [TrainingJob.to_json(), ...], "timeout_s": float}. The jobs run one after another in
one process group, which saves torchrun's start-up per plan; rank 0's result is the list of their result
dicts. Failure handling and the files written are `launcher.rank_main`'s.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from uniap.errors import UniapError
from uniap.runtime.job import TrainingJob
from uniap.runtime.faults import fault_from_env
from uniap.runtime.launcher import rank_main
from uniap.runtime.train import Context, train_job


def select_device(local_rank: int) -> tuple[torch.device, str]:
    """(device, backend) of a rank: cuda:LOCAL_RANK with NCCL where CUDA is available, else CPU with gloo.

    One rank per GPU: a local rank without its own GPU is refused rather than doubled up on one.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu"), "gloo"
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UniapError(f"local rank {local_rank} has no GPU of its own ({count} visible): use --nproc <= {count}")
    return torch.device("cuda", local_rank), "nccl"


def init_distributed(timeout_s: float) -> Context:
    """Join (or create) the default process group on this rank's device (see `select_device`).

    `timeout_s` bounds every collective, including those on the subgroups and meshes created later
    (the library's default subgroup timeout is 30 minutes, so it is lowered process-wide here).
    """
    td = timedelta(seconds=float(timeout_s))
    c10d.default_pg_timeout = td
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = td
    device, backend = select_device(int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise UniapError(f"not launched by torchrun ({var} unset): pass nproc to spawn ranks")
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=td, **kwargs)
    return Context(rank=dist.get_rank(), world=dist.get_world_size(), device=device)


def run_jobs(jobs: list[TrainingJob], timeout_s: float) -> list[dict | None]:
    ctx = init_distributed(timeout_s)
    fault = fault_from_env(ctx.rank)  # the failure-handling tests' injected fault, if any
    results = []
    for job in jobs:
        results.append(train_job(job, ctx, before_step=fault))
        dist.barrier()
    return results


def _body(payload: dict, out) -> list[dict | None]:
    jobs = [TrainingJob.from_json(j) for j in payload["jobs"]]
    return run_jobs(jobs, float(payload.get("timeout_s", 120.0)))


if __name__ == "__main__":
    rank_main(_body, "python -m uniap.runtime.worker PAYLOAD.json OUT_DIR")
