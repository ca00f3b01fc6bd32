"""The one launcher and the one training-job type, without spawning anything."""

from __future__ import annotations

import json

import pytest

from uniap.errors import UniapError
from uniap.runtime.job import TrainingJob
from uniap.runtime.launcher import Nodes, failure_line, signal_deaths, torchrun_command

# torchrun 2.13's failure report when local rank 1 of node 1 (global rank 3) is SIGKILLed.
REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
uniap.runtime.worker FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_11:40:00
  host      : box
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
"""


def test_job_makes_paths_absolute_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = TrainingJob("plan.json", steps=5, checkpoint_dir="ck", checkpoint_every=2)
    assert job.plan == str(tmp_path / "plan.json") and job.checkpoint_dir == str(tmp_path / "ck")
    assert TrainingJob.from_json(json.loads(json.dumps(job.to_json()))) == job
    with pytest.raises(Exception):
        job.steps = 3  # frozen


@pytest.mark.parametrize("fields, message", [
    (dict(optimizer="lion"), "unknown optimizer 'lion'"),
    (dict(steps=-1), "steps must be >= 0"),
    (dict(checkpoint_every=-2, checkpoint_dir="x"), "checkpoint_every must be >= 0"),
    (dict(resume=True), "need a checkpoint_dir"),
])
def test_job_refuses_bad_fields(fields, message):
    with pytest.raises(UniapError, match=message):
        TrainingJob("p.json", **fields)


def test_job_from_json_refuses_unknown_fields():
    with pytest.raises(UniapError, match=r"unknown training-job fields \['stpes'\]"):
        TrainingJob.from_json({"plan": "p.json", "stpes": 3})


def test_standalone_and_rendezvous_commands(monkeypatch):
    monkeypatch.setenv("RANK", "7")
    cmd, env = torchrun_command(["-m", "uniap.runtime.worker"], Nodes(4), "a", "b")
    assert "--standalone" in cmd and "--nproc-per-node=4" in cmd and cmd[-4:] == ["-m", "uniap.runtime.worker", "a", "b"]
    assert "RANK" not in env and env["OMP_NUM_THREADS"]
    cmd, _ = torchrun_command(["script.py"], Nodes(2, nnodes=2, node_rank=1, endpoint="10.0.0.1:29400"))
    assert "--standalone" not in cmd
    assert {"--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400"} <= set(cmd)


@pytest.mark.parametrize("fields, message", [
    (dict(nproc_per_node=0), "--nproc must be >= 1"),
    (dict(nproc_per_node=2, nnodes=2), "need --rdzv-endpoint"),
    (dict(nproc_per_node=2, nnodes=2, node_rank=2, endpoint="h:1"), r"--node-rank must be in 0\.\.1"),
    (dict(nproc_per_node=2, nnodes=2, endpoint="h"), "HOST:PORT"),
])
def test_nodes_refuse_bad_layouts(fields, message):
    with pytest.raises(UniapError, match=message):
        Nodes(**fields)


def test_signal_death_outranks_the_survivors_errors(tmp_path):
    out, log = tmp_path / "out", tmp_path / "torchrun.log"
    out.mkdir()
    log.write_text(REPORT)
    assert signal_deaths(REPORT) == {3: 9}
    (out / "error-rank2.json").write_text(json.dumps(
        {"rank": "2", "time": 1.0, "type": "DistBackendError", "message": "Connection closed by peer"}))
    line = failure_line(out, log, 1, Nodes(2, nnodes=2, node_rank=1, endpoint="h:1"))
    assert line.startswith("rank 3 was killed by signal 9 (SIGKILL)") and "\n" not in line


def test_first_error_is_the_cause_and_quiet_ranks_are_named(tmp_path):
    out, log = tmp_path / "out", tmp_path / "torchrun.log"
    out.mkdir()
    log.write_text("")
    for rank in range(4):
        (out / f"rank{rank}.started").touch()
    for rank, t, msg in ((1, 2.0, "Connection closed by peer"), (0, 1.0, "wait timed out after 30 s")):
        (out / f"error-rank{rank}.json").write_text(json.dumps(
            {"rank": str(rank), "time": t, "type": "DistBackendError", "message": msg}))
    line = failure_line(out, log, 1, Nodes(4))
    assert line.startswith("rank 0 failed: DistBackendError: wait timed out") and "stopped answering: [2, 3]" in line
    assert failure_line(out, log, -9, Nodes(4)).startswith("rank 0 failed")  # a rank's error outranks the agent
    for path in out.glob("error-rank*.json"):
        path.unlink()
    assert failure_line(out, log, -9, Nodes(4)).startswith(
        "run failed: the torchrun agent of node 0 was killed by signal 9 (SIGKILL), and with it ranks 0, 1, 2, 3")


def test_a_rank_killed_outranks_the_peers_torchrun_terminated(tmp_path):
    """A two-node run with rank 3 killed: its node's agent SIGTERMs rank 2, and its report may list rank 2 first.
    The SIGKILL is the cause (seen once in CI as "rank 2 was killed by signal 15")."""
    out, log = tmp_path / "out", tmp_path / "torchrun.log"
    out.mkdir()
    terminated = REPORT.replace("rank      : 3 (local_rank: 1)", "rank      : 2 (local_rank: 0)") \
        .replace("exitcode  : -9", "exitcode  : -15")
    log.write_text(terminated + REPORT)
    assert signal_deaths(terminated + REPORT) == {2: 15, 3: 9}
    line = failure_line(out, log, 1, Nodes(2, nnodes=2, node_rank=1, endpoint="h:1"))
    assert line.startswith("rank 3 was killed by signal 9 (SIGKILL)")
