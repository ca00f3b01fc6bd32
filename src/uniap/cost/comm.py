"""α–β times of collectives, with the bus-bandwidth factors of ring algorithms.

`bandwidth` is the per-device bus bandwidth (what nccl-tests calls busbw), so a ring all-reduce of
B bytes over n devices takes 2(n−1) steps of latency α and moves 2(n−1)/n · B bytes per device
(Patarasuk & Yuan 2009; NCCL docs "Performance" on algbw vs busbw).
"""

from __future__ import annotations

from uniap.spec.cluster import Link


def all_reduce(nbytes: float, n: int, link: Link) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bandwidth


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """`nbytes` is the size of the *gathered* (full) buffer. Its steps cost the link's ring all-gather α
    (`Link.gather_step_s`: larger than an all-reduce's across nodes, cost.tables._slowest)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.gather_step_s + (n - 1) / n * nbytes / link.bandwidth


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """`nbytes` is the size of the full (unreduced) buffer each device starts with."""
    return all_gather(nbytes, n, link)


def all_to_all(nbytes: float, n: int, link: Link) -> float:
    """Each device holds `nbytes` and keeps 1/n of it."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth


def p2p(nbytes: float, link: Link) -> float:
    if nbytes <= 0:
        return 0.0
    return link.latency_s + nbytes / link.bandwidth
