"""How the launchers of a several-machine run agree on why it failed.

A rank killed on one machine writes nothing; torchrun on that machine knows its signal, but the ranks on the
other machines only see a closed connection. So on failure every node's launcher posts its own diagnosis to a
small key-value store that node 0's launcher hosts (`TCPStore` on the rendezvous host, port + 1), waits a
few seconds for the other nodes' posts, and reports the strongest one: a signal death over a rank's error
over anything else, the earliest first.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

from uniap.errors import UniapError

WAIT_S = 10.0  # how long a failed node waits for the others' diagnoses


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

    def __init__(self, endpoint: str, nnodes: int, node_rank: int):
        host, port = endpoint.rsplit(":", 1)
        self.host, self.port, self.nnodes, self.node_rank = host, int(port) + 1, nnodes, node_rank
        self._store = None
        if node_rank == 0:
            from torch.distributed import TCPStore

            try:
                self._store = TCPStore(host, self.port, nnodes, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=WAIT_S))
            except (RuntimeError, OSError) as exc:
                raise UniapError(f"cannot listen on {host}:{self.port} (rendezvous port + 1, where the nodes "
                                 f"exchange failure reports): {' '.join(str(exc).split())[:200]}") from None

    def exchange(self, mine: Diagnosis) -> Diagnosis:
        """Post this node's diagnosis, gather the others' for up to WAIT_S, return the strongest."""
        try:
            store = self._store or self._connect()
            store.set(f"diagnosis/{self.node_rank}", json.dumps(asdict(mine)))
            keys = [f"diagnosis/{r}" for r in range(self.nnodes) if r != self.node_rank]
            deadline = time.monotonic() + WAIT_S
            while not store.check(keys) and time.monotonic() < deadline:
                time.sleep(0.2)
            found = [mine] + [Diagnosis(**json.loads(store.get(k))) for k in keys if store.check([k])]
        except (RuntimeError, OSError, ValueError):  # node 0 gone: this node's own account is all there is
            return mine
        return Diagnosis.strongest(found)

    def _connect(self):
        from torch.distributed import TCPStore

        return TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=WAIT_S))
