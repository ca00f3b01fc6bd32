"""Entry points: run a plan on this host (spawning torchrun) or inside an existing torchrun world.

    run(plan_path, steps=3, nproc=4, check=True) -> result dict (rank 0's view; see train.py)

- `nproc` given: spawns `python -m torch.distributed.run --standalone --nproc-per-node N
  -m uniap.runtime.worker ...` on this host and returns rank 0's result (read from a result file).
- `nproc` None inside a torchrun world (RANK/WORLD_SIZE set): runs in this process on the
  environment's world; every rank returns rank 0's result.
- `nproc` None otherwise: spawns the plan's world size on this host.

`steps` is the total step count: a resumed run continues from its checkpoint's step up to `steps`.
Bad input raises UniapError (one line) before anything is spawned where it can be checked here; a
failing rank surfaces as UniapError naming the rank and its error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from uniap.errors import UniapError
from uniap.plan import Plan

MAX_LOCAL_SPAWN = 64


def _job(plan_path, *, steps=3, check=False, data=None, seed=0, lr=1e-3, checkpoint_dir=None, checkpoint_every=0,
         resume=False, optimizer="sgd") -> dict:
    if optimizer not in ("sgd", "adamw"):
        raise UniapError(f"unknown optimizer {optimizer!r} (sgd or adamw)")
    return {"plan": str(Path(plan_path).resolve()), "steps": int(steps), "check": bool(check),
            "data": str(Path(data).resolve()) if data else None, "seed": int(seed), "lr": float(lr),
            "checkpoint_dir": str(Path(checkpoint_dir).resolve()) if checkpoint_dir else None,
            "checkpoint_every": int(checkpoint_every or 0), "resume": bool(resume), "optimizer": optimizer}


def run(plan_path: str, *, steps: int = 3, nproc: int | None = None, check: bool = False, data: str | None = None,
        seed: int = 0, lr: float = 1e-3, checkpoint_dir: str | None = None, checkpoint_every: int = 0,
        resume: bool = False, timeout_s: float = 120.0, optimizer: str = "sgd") -> dict:
    """Train up to `steps` steps of the plan at `plan_path`; return the result dict (see `uniap.runtime.train`).

    optimizer: "sgd" (momentum 0.9, default) or "adamw"; the check reference uses the same.
    """
    job = _job(plan_path, steps=steps, check=check, data=data, seed=seed, lr=lr, checkpoint_dir=checkpoint_dir,
               checkpoint_every=checkpoint_every, resume=resume, optimizer=optimizer)
    return run_many([job], nproc=nproc, timeout_s=timeout_s)[0]


def run_many(jobs: list[dict], *, nproc: int | None = None, timeout_s: float = 120.0) -> list[dict]:
    """Run several jobs (dicts with run()'s keyword names plus "plan") in one launch, in order."""
    if not jobs:
        return []
    jobs = [_job(j["plan"], **{k: v for k, v in j.items() if k != "plan"}) for j in jobs]
    if timeout_s <= 0:
        raise UniapError("timeout_s must be positive")
    from uniap.runtime.checks import (
        check_plan,  # torch-free import chain up to here is not needed
    )

    worlds = set()
    for job in jobs:
        plan = Plan.load(job["plan"])
        if job["steps"] < 0:
            raise UniapError("steps must be >= 0")
        if job["checkpoint_every"] < 0:
            raise UniapError("checkpoint_every must be >= 0")
        if (job["checkpoint_every"] or job["resume"]) and not job["checkpoint_dir"]:
            raise UniapError("checkpointing and resume need a checkpoint_dir")
        if job["data"] and not Path(job["data"]).is_file():
            raise UniapError(f"data file {job['data']} does not exist")
        worlds.add(plan.world_size)
        shape = check_plan(plan, plan.world_size)  # plan-internal errors, before any process starts
        if job["resume"]:
            _check_resumable(job["checkpoint_dir"], shape, job["optimizer"])
    if len(worlds) != 1:
        raise UniapError(f"jobs of one launch must share a world size, got {sorted(worlds)}")
    world = worlds.pop()

    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if nproc is None and under_torchrun:
        env_world = int(os.environ["WORLD_SIZE"])
        if env_world != world:
            raise UniapError(f"plan is for {world} ranks but the torchrun world has {env_world}")
        return _run_here(jobs, timeout_s)
    if nproc is not None and int(nproc) != world:
        raise UniapError(f"plan is for {world} ranks but nproc={nproc}")
    if nproc is None and world > MAX_LOCAL_SPAWN:
        raise UniapError(f"plan needs {world} ranks; launch it with torchrun across nodes (or pass nproc)")
    return _spawn(jobs, world, timeout_s)


def _check_resumable(checkpoint_dir: str, shape, optimizer: str) -> None:
    from uniap.runtime import checkpoint as ckpt
    from uniap.runtime.train import check_resumable

    found = ckpt.latest(checkpoint_dir)
    if found is not None:  # else nothing to resume from: the run starts at step 0
        check_resumable(found[1], shape, optimizer)


def _run_here(jobs: list[dict], timeout_s: float) -> list[dict]:
    import torch.distributed as dist

    from uniap.runtime.worker import run_jobs

    results = run_jobs(jobs, timeout_s)
    box = [results if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _package_root() -> str:
    import uniap

    return str(Path(uniap.__file__).resolve().parent.parent)


def torchrun(module: str, nproc: int, *args) -> tuple[list[str], dict]:
    """Command and environment that start `python -m module *args` on `nproc` local ranks with torchrun.

    The caller's own torchrun variables are dropped (a nested launch must not inherit them), and each rank
    gets one OpenMP thread (DESIGN: 2 threads per rank with 4 ranks on 2 cores was 4–5× slower).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0", "--monitor-interval=0.5", "-m", module, *map(str, args)]
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                "TORCHELASTIC_RUN_ID"):
        env.pop(var, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    return cmd, env


def _spawn(jobs: list[dict], world: int, timeout_s: float) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="uniap-run-"))
    out = workdir / "out"
    out.mkdir()
    (workdir / "jobs.json").write_text(json.dumps({"jobs": jobs, "timeout_s": timeout_s}))
    log = workdir / "torchrun.log"
    cmd, env = torchrun("uniap.runtime.worker", world, workdir / "jobs.json", out)
    # Collectives time out after timeout_s, so no step can outlast it; this only guards the launcher.
    total_steps = sum(max(j["steps"], 1) for j in jobs)
    wall = float(timeout_s) * (4 + total_steps) + 60.0
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=wall)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise UniapError(f"run exceeded {wall:.0f} s and was killed (log: {log})") from None
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    if rc != 0:
        raise UniapError(_failure_line(out, log, rc, world))
    results = []
    for i in range(len(jobs)):
        path = out / f"result-{i}.json"
        if not path.is_file():
            raise UniapError(f"run finished without a result for job {i} (log: {log})")
        results.append(json.loads(path.read_text()))
    shutil.rmtree(workdir, ignore_errors=True)
    return results


def _failure_line(out: Path, log: Path, rc: int, world: int) -> str:
    errors = []
    for path in out.glob("error-rank*.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if errors:
        # The rank that failed first is the cause; the others fail because it left.
        first = min(errors, key=lambda e: e.get("time", 0.0))
        if first.get("uniap_error"):
            return first["message"]
        note = ""
        if "timed out" in first["message"].lower() or "timeout" in first["message"].lower():
            # A rank that stopped answering reports nothing; the others time out waiting for it.
            quiet = sorted(set(range(world)) - {int(e["rank"]) for e in errors if str(e.get("rank")).isdigit()})
            if quiet:
                note = f"; ranks that stopped answering: {quiet}"
        return f"rank {first['rank']} failed: {first['type']}: {first['message'][:500]}{note} (log: {log})"
    tail = ""
    try:
        lines = [l.strip() for l in log.read_text(errors="replace").splitlines() if l.strip()]
        tail = lines[-1][:300] if lines else ""
    except OSError:
        pass
    return f"torchrun exited with code {rc}: {tail} (log: {log})"
