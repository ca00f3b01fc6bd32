"""Entry points: run training jobs on this machine (spawning torchrun) or inside an existing torchrun world.

    run(plan_path, *, nproc=None, timeout_s=120, nodes=None, **TrainingJob fields) -> rank 0's result dict
    run_many(jobs: list[TrainingJob], *, nproc=None, timeout_s=120, nodes=None) -> list of result dicts

- `nodes` (a `launcher.Nodes`) given: starts this machine's share of a several-machine launch (torchrun's c10d
  rendezvous); the machine holding rank 0 returns the results, the others a list of None.
- `nproc` given: spawns that many local ranks (`--standalone`).
- neither, inside a torchrun world (RANK/WORLD_SIZE set): runs in this process on the environment's world;
  every rank returns rank 0's results.
- neither, otherwise: spawns the plan's world size on this machine.

Bad input raises UniapError (one line) before anything is spawned; a failing rank surfaces as UniapError
naming the rank and its error or signal (see `launcher.failure_line`).
"""

from __future__ import annotations

import os

from uniap.errors import UniapError
from uniap.plans import Plan
from uniap.runtime.job import TrainingJob
from uniap.runtime.launcher import Nodes, launch

MAX_LOCAL_SPAWN = 64
WORKER = ["-m", "uniap.runtime.worker"]


def run(plan_path: str, *, nproc: int | None = None, timeout_s: float = 120.0, nodes: Nodes | None = None,
        **job_fields) -> dict | None:
    """Train one plan (`job_fields`: TrainingJob's fields); return rank 0's result (see `uniap.runtime.train`)."""
    return run_many([TrainingJob(plan_path, **job_fields)], nproc=nproc, timeout_s=timeout_s, nodes=nodes)[0]


def run_many(jobs: list[TrainingJob], *, nproc: int | None = None, timeout_s: float = 120.0,
             nodes: Nodes | None = None) -> list[dict | None]:
    """Run several jobs in one launch, in order (saves torchrun's start-up per plan)."""
    if not jobs:
        return []
    if timeout_s <= 0:
        raise UniapError(f"timeout_s must be positive, got {timeout_s}")
    world = _check_jobs(jobs)

    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if nodes is None and nproc is None and under_torchrun:
        env_world = int(os.environ["WORLD_SIZE"])
        if env_world != world:
            raise UniapError(f"plan is for {world} ranks but the torchrun world has {env_world}")
        return _run_here(jobs, timeout_s)
    if nodes is None:
        if nproc is not None and int(nproc) != world:
            raise UniapError(f"plan is for {world} ranks but nproc={nproc}")
        if nproc is None and world > MAX_LOCAL_SPAWN:
            raise UniapError(f"plan needs {world} ranks; start it on several machines (--nnodes, see the README)")
        nodes = Nodes(world)
    elif nodes.world != world:
        raise UniapError(f"plan is for {world} ranks but {nodes.nnodes} nodes × {nodes.nproc_per_node} = "
                         f"{nodes.world}")
    # Collectives time out after timeout_s, so no step can outlast it; this only guards the launcher.
    wall = float(timeout_s) * (4 + sum(max(j.steps, 1) for j in jobs)) + 60.0
    payload = {"jobs": [j.to_json() for j in jobs], "timeout_s": float(timeout_s)}
    results = launch(WORKER, payload, nodes, wall_s=wall, what="run", timeout_s=timeout_s)
    return list(results) if results is not None else [None] * len(jobs)


def _check_jobs(jobs: list[TrainingJob]) -> int:
    """Everything that can be refused here, before a process starts; returns the jobs' common world size."""
    from uniap.runtime.checks import check_plan

    worlds = set()
    for job in jobs:
        if not isinstance(job, TrainingJob):
            raise UniapError(f"a job must be a TrainingJob, got {type(job).__name__}")
        plan = Plan.load(job.plan)
        if job.data and not os.path.isfile(job.data):
            raise UniapError(f"data file {job.data} does not exist")
        worlds.add(plan.world_size)
        shape = check_plan(plan, plan.world_size, job.impl)  # plan-internal errors
        if job.resume:
            _check_resumable(job.checkpoint_dir, shape, job.optimizer)
    if len(worlds) != 1:
        raise UniapError(f"jobs of one launch must share a world size, got {sorted(worlds)}")
    return worlds.pop()


def _check_resumable(checkpoint_dir: str, shape, optimizer: str) -> None:
    from uniap.runtime import checkpoint as ckpt
    from uniap.runtime.train import check_resumable

    found = ckpt.latest(checkpoint_dir)
    if found is not None:  # else nothing to resume from: the run starts at step 0
        check_resumable(found[1], shape, optimizer)


def _run_here(jobs: list[TrainingJob], timeout_s: float) -> list[dict]:
    import torch.distributed as dist

    from uniap.runtime.worker import run_jobs

    results = run_jobs(jobs, timeout_s)
    box = [results if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
