"""Several machines, played by two torchrun agents on 127.0.0.1 (2 × 2 ranks) started by `uniap run`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from runtime_cases import GPT, LR
from uniap.runtime.plans import uniform_plan


def _free_port() -> int:
    """A port whose successor is free too (the nodes' launchers exchange failure reports on port + 1)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no pair of free ports")


def _start_two_nodes(plan_path, *extra, env=None) -> list[subprocess.Popen]:
    port = _free_port()
    return [subprocess.Popen([sys.executable, "-m", "uniap.cli", "run", "--plan", str(plan_path), "--nproc", "2",
                              "--nnodes", "2", "--node-rank", str(r), "--rdzv-endpoint", f"127.0.0.1:{port}",
                              "--lr", str(LR), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})
            for r in (0, 1)]


def _finish(procs: list[subprocess.Popen]) -> list[subprocess.CompletedProcess]:
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=120), *p.communicate()) for p in procs]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def test_two_nodes_match_one_process(tmp_path):
    plan = tmp_path / "plan.json"
    uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=2).save(plan)  # a stage per "machine", dp inside it
    ends = _finish(_start_two_nodes(plan, "--steps", "2", "--check", "--format", "json"))
    assert all(end.returncode == 0 for end in ends), [end.stderr[-2000:] for end in ends]
    # torchrun's c10d rendezvous numbers the machines in the order they join: either may hold rank 0.
    reporter, other = sorted(ends, key=lambda end: "reports the results" in end.stdout)
    assert "the node that ran rank 0 reports the results" in other.stdout
    result = json.loads(reporter.stdout)
    assert result["world_size"] == 4 and result["steps"] == 2
    assert result["check"]["max_rel_loss_diff"] < 1e-5 and result["check"]["max_rel_param_diff"] < 1e-5


def test_killed_rank_is_named_on_both_nodes(tmp_path):
    plan = tmp_path / "plan.json"
    uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=2).save(plan)
    t0 = time.monotonic()
    ends = _finish(_start_two_nodes(plan, "--steps", "2", "--timeout", "30",
                                    env={"UNIAP_FAIL_RANK": "3", "UNIAP_FAIL_STEP": "0", "UNIAP_FAIL_MODE": "kill"}))
    assert time.monotonic() - t0 < 90
    for end in ends:
        lines = end.stderr.strip().splitlines()
        assert end.returncode != 0 and len(lines) == 1, end.stderr[-2000:]
        assert lines[0].startswith("uniap: error: rank 3 was killed by signal 9 (SIGKILL)"), lines[0]


def test_killed_agent_is_named_on_both_nodes(tmp_path):
    plan = tmp_path / "plan.json"
    uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=2).save(plan)
    t0 = time.monotonic()
    procs = _start_two_nodes(plan, "--steps", "1000", "--timeout", "30")
    agent, started = None, []
    while len(started) < 2 and time.monotonic() - t0 < 60:  # node 1's agent, once both its ranks have started
        agents = _children(procs[1].pid)
        if agents:
            agent = agents[0]
            with open(f"/proc/{agent}/cmdline") as fh:
                payload = next(a for a in fh.read().split("\0") if a.endswith("payload.json"))
            started = list((Path(payload).parent / "out").glob("rank*.started"))
        time.sleep(0.2)
    assert len(started) == 2, "node 1's ranks did not start"
    time.sleep(2)  # into the training steps
    os.kill(agent, signal.SIGKILL)
    for end in _finish(procs):
        lines = end.stderr.strip().splitlines()
        assert end.returncode != 0 and len(lines) == 1, end.stderr[-2000:]
        assert lines[0].startswith("uniap: error: run failed: the torchrun agent of node 1 was killed by signal 9 "
                                   "(SIGKILL), and with it ranks "), lines[0]
    assert time.monotonic() - t0 < 120
