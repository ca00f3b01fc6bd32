"""How the launchers of a several-machine run agree on why it failed.

A rank killed on one machine writes nothing; torchrun on that machine knows its signal, but the ranks on the
other machines only see a closed connection. So on failure every node's launcher posts its own diagnosis to a
small key-value store that node 0's launcher hosts (`TCPStore` on the rendezvous host, port + 1), waits for
the other nodes' posts (at most the run's collective timeout: every node fails within it), and reports the
strongest one: a signal death over a rank's error over anything else, the earliest first. Node 0 keeps the
store open until every node has read (a client whose server vanishes prints C++ warnings).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

from uniap.errors import UniapError

CONNECT_S = 10.0  # how long a node tries to reach node 0's store


@dataclass(frozen=True)
class Diagnosis:
    """One node's account of a failed launch."""

    line: str
    """The one line shown to the user."""
    strength: int
    """2: a rank killed by a signal (a root cause); 1: a rank's own error; 0: anything else."""
    time: float
    """When the failure happened (the error's time stamp, or when it was seen)."""

    @staticmethod
    def strongest(found: list["Diagnosis"]) -> "Diagnosis":
        return min(found, key=lambda d: (-d.strength, d.time))


class FailureExchange:
    """Node 0 hosts the store from the start; the other nodes connect only when they have something to post."""

    def __init__(self, endpoint: str, nnodes: int, node_rank: int, wait_s: float):
        host, port = endpoint.rsplit(":", 1)
        self.host, self.port, self.nnodes, self.node_rank = host, int(port) + 1, nnodes, node_rank
        self.wait_s = float(wait_s)
        self._store = None
        if node_rank == 0:
            from torch.distributed import TCPStore

            try:
                self._store = TCPStore(host, self.port, nnodes, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=CONNECT_S))
            except (RuntimeError, OSError) as exc:
                raise UniapError(f"cannot listen on {host}:{self.port} (rendezvous port + 1, where the nodes "
                                 f"exchange failure reports): {' '.join(str(exc).split())[:200]}") from None

    def exchange(self, mine: Diagnosis) -> Diagnosis:
        """Post this node's diagnosis, gather the others' (waiting at most `wait_s`), return the strongest."""
        try:
            store = self._store or self._connect()
            store.set(f"diagnosis/{self.node_rank}", json.dumps(asdict(mine)))
            others = [r for r in range(self.nnodes) if r != self.node_rank]
            self._wait(store, [f"diagnosis/{r}" for r in others], self.wait_s)
            found = [mine] + [Diagnosis(**json.loads(store.get(f"diagnosis/{r}"))) for r in others
                              if store.check([f"diagnosis/{r}"])]
            store.set(f"read/{self.node_rank}", "1")
            if self._store is not None:  # the host: stay until the others have read
                self._wait(store, [f"read/{r}" for r in others], CONNECT_S)
        except (RuntimeError, OSError, ValueError):  # node 0 gone: this node's own account is all there is
            return mine
        return Diagnosis.strongest(found)

    @staticmethod
    def _wait(store, keys: list[str], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.2)

    def _connect(self):
        from torch.distributed import TCPStore

        return TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=CONNECT_S))
