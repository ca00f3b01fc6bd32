"""Processes a command starts end with it: a child asks Linux to kill it when its parent dies.

A SIGTERM (from `timeout`, a supervisor, a CI runner) ends the command at once, without the clean-up that would
stop its children; torchrun's ranks and the search's worker processes would otherwise run on as orphans."""

from __future__ import annotations

import os
import signal
import sys


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the thread that started it (its parent) dies; a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
