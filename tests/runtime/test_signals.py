"""A signal that ends `uniap run`, `uniap profile` or `uniap plan` ends every process it started: SIGTERM (from
`timeout`, a supervisor, a CI runner, `subprocess.terminate()`) to the command while its ranks train or measure, or
while its search's worker processes bound and solve, and no process of that launch is left afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runtime_cases import GPT

UNIAP = Path(sys.executable).with_name("uniap")


def _tagged(tag: str) -> list[int]:
    """Pids of the processes whose environment carries `tag` (the command, torchrun and its ranks inherit it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if tag.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return pids


def _ranks(tag: str, module: str) -> list[int]:
    out = []
    for pid in _tagged(tag):
        try:
            if module.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc to find the launched processes")
@pytest.mark.parametrize("command, module, started", [
    ("run", "uniap.runtime.worker", 2),
    ("profile", "uniap.profile.worker", 2),
    ("plan", "multiprocessing.spawn", 2),
])
def test_sigterm_ends_every_process_the_command_started(tmp_path, command, module, started):
    from uniap.runtime.plans import uniform_plan

    tag = f"UNIAP_SIGNAL_TEST={uuid.uuid4().hex}"
    name, value = tag.split("=")
    if command == "run":
        uniform_plan(GPT, 2, global_batch=4, seq_len=32).save(tmp_path / "plan.json")
        args = ["run", "--plan", str(tmp_path / "plan.json"), "--steps", "100000"]
    elif command == "profile":
        args = ["profile", "--model", "tiny-gpt", "--nproc", "2", "--passes", "20", "--out", str(tmp_path / "p.json")]
    else:  # a search long enough to bound its candidates in worker processes (GPT 1T: ~2,300 of them)
        args = ["plan", "--model", "gpt-1t", "--cluster", "a100-80g:384x8", "--global-batch", "3072"]
    env = {**os.environ, name: value, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([str(UNIAP), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(_ranks(tag, module)) < started:  # the ranks (or a search worker) are up
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2 if command == "plan" else 0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) in (128 + signal.SIGTERM, -signal.SIGTERM)  # its own exit, or the signal's
        deadline = time.monotonic() + 15
        while _tagged(tag) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert _tagged(tag) == [], "processes left running after SIGTERM"
    finally:
        for pid in _tagged(tag):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
