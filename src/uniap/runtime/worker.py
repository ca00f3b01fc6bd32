"""The per-rank entry point torchrun starts: `python -m uniap.runtime.worker JOBS.json OUT_DIR`.

JOBS.json: {"jobs": [{"plan": path, "steps": .., "check": .., ...}, ...], "timeout_s": float}.
Several jobs (plans) run one after another in one process group, which saves torchrun's start-up
per plan. Rank 0 writes OUT_DIR/result-<i>.json per job. A rank that fails writes
OUT_DIR/error-rank<r>.json (time, type, message, traceback), prints the traceback and exits
non-zero at once; torchrun then stops the other ranks, and collectives bounded by `timeout_s`
keep anything from hanging.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from uniap.errors import UniapError
from uniap.runtime.train import Context, train_job


def init_distributed(timeout_s: float) -> Context:
    """Join (or create) the default process group: gloo on CPU, NCCL on CUDA (device = cuda:LOCAL_RANK).

    `timeout_s` bounds every collective, including those on the subgroups and meshes created later
    (the library's default subgroup timeout is 30 minutes, so it is lowered process-wide here).
    """
    td = timedelta(seconds=float(timeout_s))
    c10d.default_pg_timeout = td
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = td
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            if var not in os.environ:
                raise UniapError(f"not launched by torchrun ({var} unset): pass nproc to spawn ranks")
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=td, **kwargs)
    return Context(rank=dist.get_rank(), world=dist.get_world_size(), device=device)


def run_jobs(jobs: list[dict], timeout_s: float) -> list[dict | None]:
    ctx = init_distributed(timeout_s)
    results = []
    for job in jobs:
        results.append(train_job(job, ctx))
        dist.barrier()
    return results


def _write_error(out: Path, exc: BaseException) -> None:
    rank = os.environ.get("RANK", "?")
    record = {"rank": rank, "time": time.time(), "type": type(exc).__name__,
              "message": " ".join(str(exc).split()) or type(exc).__name__,
              "uniap_error": isinstance(exc, UniapError),
              "traceback": traceback.format_exc()}
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".error-rank{rank}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, out / f"error-rank{rank}.json")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m uniap.runtime.worker JOBS.json OUT_DIR", file=sys.stderr)
        sys.exit(2)
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    try:
        results = run_jobs(spec["jobs"], float(spec.get("timeout_s", 120.0)))
        if dist.get_rank() == 0:
            for i, res in enumerate(results):
                tmp = out / f".result-{i}.tmp"
                tmp.write_text(json.dumps(res))
                os.replace(tmp, out / f"result-{i}.json")
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure must end this rank, fast
        _write_error(out, exc)
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
