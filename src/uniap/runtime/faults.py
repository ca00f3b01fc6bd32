"""Injected faults, for the tests of failure handling: the worker turns these environment variables into a
`before_step` hook of `train.train_job`, so the training loop itself reads no environment.

    UNIAP_FAIL_RANK=R      the rank that fails
    UNIAP_FAIL_STEP=N      before which step (default 0)
    UNIAP_FAIL_MODE=MODE   raise (default) | hang: stop answering (sleep), which the collective timeouts must bound |
                           kill: die of SIGKILL, as a machine that loses a process
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

FAIL_RANK_ENV = "UNIAP_FAIL_RANK"
FAIL_STEP_ENV = "UNIAP_FAIL_STEP"
FAIL_MODE_ENV = "UNIAP_FAIL_MODE"


def fault_from_env(rank: int) -> Callable[[int], None] | None:
    """The hook that makes this rank fail where the environment says, or None when no fault is asked of it."""
    want = os.environ.get(FAIL_RANK_ENV, "").strip()
    if not want or int(want) != rank:
        return None
    at, mode = int(os.environ.get(FAIL_STEP_ENV, "0")), os.environ.get(FAIL_MODE_ENV, "raise")

    def fail(step: int) -> None:
        if step != at:
            return
        if mode == "hang":
            time.sleep(3600)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure on rank {rank} at step {step} ({FAIL_RANK_ENV})")

    return fail
