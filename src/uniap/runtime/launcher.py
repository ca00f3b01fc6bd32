"""The one torchrun launcher, shared by `uniap run` and `uniap profile`: spawn, guard, explain a failure.

Parent side: `launch(entry, payload, nodes, ...)` writes the payload, starts torchrun on this machine
(`--standalone`, or torchrun's c10d rendezvous when `nodes` spans several machines), waits, and returns what
rank 0 wrote. Rank side: `rank_main(body)` is the `__main__` of a worker module; it reads the payload, runs
`body`, writes rank 0's `result.json`, and on any failure writes `error-rank<r>.json` and exits at once, so
that torchrun stops the others and the parent can name the rank that failed first.

On several machines the nodes' launchers agree on the cause first (`failure_exchange`). Ranks die with their
agent (`PR_SET_PDEATHSIG`): torchrun starts each rank in its own session, so a killed agent would otherwise
leave its ranks running on as orphans.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from uniap.children import die_with_parent
from uniap.errors import UniapError
from uniap.runtime.failure_exchange import Diagnosis, FailureExchange

RESULT = "result.json"
PAYLOAD = "payload.json"
# torchrun variables a nested launch must not inherit.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "LOCAL_WORLD_SIZE",
                 "TORCHELASTIC_RUN_ID", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE")


@dataclass(frozen=True)
class Nodes:
    """Where a launch's ranks run: `nproc_per_node` ranks on each of `nnodes` machines."""

    nproc_per_node: int
    """Ranks (processes, one per device) on this machine."""
    nnodes: int = 1
    """Machines taking part; each runs the same `uniap` command with its own `node_rank`."""
    node_rank: int = 0
    """This machine's index, 0 .. nnodes − 1; node 0 is the machine at `endpoint`. torchrun's c10d rendezvous
    numbers the machines' ranks in the order they join, so rank 0 (which returns the result) may be anywhere."""
    endpoint: str | None = None
    """HOST:PORT of torchrun's c10d rendezvous (node 0's address); None on one machine (`--standalone`)."""

    def __post_init__(self):
        if self.nproc_per_node < 1:
            raise UniapError(f"--nproc must be >= 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise UniapError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise UniapError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and not self.endpoint:
            raise UniapError("several nodes need --rdzv-endpoint HOST:PORT (node 0's address)")
        if self.endpoint is not None and not re.fullmatch(r"[^\s:]+:\d{1,5}", self.endpoint):
            raise UniapError(f"--rdzv-endpoint must be HOST:PORT, got {self.endpoint!r}")

    @property
    def world(self) -> int:
        return self.nproc_per_node * self.nnodes



def _package_root() -> str:
    import uniap

    return str(Path(uniap.__file__).resolve().parent.parent)


def torchrun_command(entry: list[str], nodes: Nodes, *args) -> tuple[list[str], dict]:
    """Command and environment that start `python <entry> *args` on this machine's ranks with torchrun.

    entry: ["-m", module] or [script path]. The caller's own torchrun variables are dropped, and each rank gets
    one OpenMP thread unless set (measured on a 2-core machine: 2 threads per rank with 4 ranks ran 4–5× slower).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nodes.nproc_per_node}",
           "--max-restarts=0", "--monitor-interval=0.5"]
    if nodes.endpoint is None:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={nodes.nnodes}", f"--node-rank={nodes.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={nodes.endpoint}", "--rdzv-id=uniap"]
    cmd += [*entry, *map(str, args)]
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
    return cmd, env


def launch(entry: list[str], payload: dict, nodes: Nodes, *, wall_s: float, what: str = "run",
           on_poll: Callable[[Path], None] | None = None, timeout_s: float = 120.0) -> object:
    """Run `entry` on this machine's ranks with `payload`; return what rank 0 wrote (None on the other machines).

    wall_s guards the launcher only (collectives time out after timeout_s on their own; on several machines a
    failed node waits that long at most for the others' diagnoses). on_poll(out_dir) is called about
    four times a second while the ranks run (progress). A failure raises UniapError with one line.
    """
    workdir = Path(tempfile.mkdtemp(prefix=f"uniap-{what}-"))
    out = workdir / "out"
    out.mkdir()
    (workdir / PAYLOAD).write_text(json.dumps(payload, default=list))
    log = workdir / "torchrun.log"
    cmd, env = torchrun_command(entry, nodes, workdir / PAYLOAD, out)
    exchange = (FailureExchange(nodes.endpoint, nodes.nnodes, nodes.node_rank, timeout_s) if nodes.nnodes > 1
                else None)
    deadline = time.monotonic() + wall_s
    with open(log, "w") as fh, _termination_raises():
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if time.monotonic() > deadline:
                    _stop(proc)
                    raise UniapError(f"{what} exceeded {wall_s:.0f} s and was killed (log: {log})")
                if on_poll is not None:
                    on_poll(out)
        except BaseException:
            _stop(proc)
            raise
    if on_poll is not None:
        on_poll(out)
    if rc != 0:
        mine = diagnose(out, log, rc, nodes, what)
        raise UniapError((exchange.exchange(mine) if exchange else mine).line)
    result = None
    if nodes.nnodes == 1 or (out / RESULT).is_file():
        try:
            result = json.loads((out / RESULT).read_text())
        except (OSError, json.JSONDecodeError):
            raise UniapError(f"{what} finished without a result (log: {log})") from None
    shutil.rmtree(workdir, ignore_errors=True)
    return result


@contextmanager
def _termination_raises():
    """While the ranks run, SIGTERM and SIGHUP (from `timeout`, a supervisor, a CI runner, `subprocess.terminate()`)
    raise SystemExit(128 + signal) here instead of ending the process at once, so that `launch` kills torchrun and
    its ranks on the way out: they run in a session of their own and would otherwise go on as orphans. Signals
    can only be caught in the main thread; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the agent; its ranks follow (PR_SET_PDEATHSIG)
        proc.wait()


# torchrun's failure report, one block per failed local rank: "rank : 3 (local_rank: 1)" ... "exitcode : -9".
_REPORTED = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def signal_deaths(log_text: str) -> dict[int, int]:
    """rank -> signal number of the ranks torchrun's failure report says were killed by a signal."""
    return {int(rank): -int(code) for rank, code in _REPORTED.findall(log_text) if int(code) < 0}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def diagnose(out: Path, log: Path, rc: int, nodes: Nodes, what: str = "run") -> Diagnosis:
    """This machine's account of a failed launch, in one line.

    A rank killed by a signal writes nothing, and its peers then fail on a closed connection or a timeout, so a
    signal death in torchrun's report outranks the error files; otherwise the rank whose error came first is the
    cause (the others fail because it left).
    """
    try:
        log_text = log.read_text(errors="replace")
    except OSError:
        log_text = ""
    errors = []
    for path in out.glob("error-rank*.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    wrote = {int(e["rank"]) for e in errors if str(e.get("rank")).isdigit()}
    here = sorted(int(p.name[4:-8]) for p in out.glob("rank*.started") if p.name[4:-8].isdigit())
    killed = {r: s for r, s in signal_deaths(log_text).items() if r not in wrote}
    now = time.time()
    if killed:
        # torchrun's agent SIGTERMs a failed rank's local peers as it tears the group down: a death by any other
        # signal is the cause, then the lowest rank
        rank, number = min(killed.items(), key=lambda item: (item[1] == signal.SIGTERM, item[0]))
        return Diagnosis(f"rank {rank} was killed by signal {number} ({_signal_name(number)}) (log: {log})", 2, now)
    if errors:
        first = min(errors, key=lambda e: e.get("time", 0.0))
        if first.get("uniap_error"):
            return Diagnosis(first["message"], 1, first.get("time", now))
        note = ""
        message = first["message"]
        if "timed out" in message.lower() or "timeout" in message.lower():
            # A rank that stopped answering reports nothing; the others time out waiting for it.
            quiet = sorted(set(here) - wrote)
            if quiet:
                note = f"; ranks that stopped answering: {quiet}"
        return Diagnosis(f"rank {first['rank']} failed: {first['type']}: {message[:500]}{note} (log: {log})", 1,
                         first.get("time", now))
    if rc < 0:
        ranks = f"ranks {', '.join(map(str, here))}" if here else f"its {nodes.nproc_per_node} ranks"
        return Diagnosis(f"{what} failed: the torchrun agent of node {nodes.node_rank} was killed by signal {-rc} "
                         f"({_signal_name(-rc)}), and with it {ranks} (log: {log})", 2, now)
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    tail = lines[-1][:300] if lines else ""
    return Diagnosis(f"{what} failed: torchrun exited with code {rc}: {tail} (log: {log})", 0, now)


def failure_line(out: Path, log: Path, rc: int, nodes: Nodes, what: str = "run") -> str:
    return diagnose(out, log, rc, nodes, what).line


# ---- rank side -------------------------------------------------------------------------------------------------

def write_json(path: Path, data: object) -> None:
    """Write atomically (the parent may read while a rank writes)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def write_error(out: Path, exc: BaseException) -> None:
    rank = os.environ.get("RANK", "?")
    record = {"rank": rank, "time": time.time(), "type": type(exc).__name__,
              "message": " ".join(str(exc).split()) or type(exc).__name__,
              "uniap_error": isinstance(exc, UniapError),
              "traceback": traceback.format_exc()}
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / f"error-rank{rank}.json", record)
    except OSError:
        pass


def rank_main(body: Callable[[dict, Path], object], usage: str, argv: list[str] | None = None) -> None:
    """`__main__` of a worker module: `python -m MODULE PAYLOAD.json OUT_DIR`.

    body(payload, out_dir) runs inside the process group it sets up and returns rank 0's result (ignored on
    other ranks); rank 0 writes it to OUT_DIR/result.json.
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(f"usage: {usage}", file=sys.stderr)
        sys.exit(2)
    die_with_parent()
    payload = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    (out / f"rank{os.environ.get('RANK', '?')}.started").touch()  # which global ranks run on this machine
    try:
        import torch.distributed as dist

        result = body(payload, out)
        if dist.get_rank() == 0:
            write_json(out / RESULT, result)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure must end this rank, fast
        write_error(out, exc)
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
