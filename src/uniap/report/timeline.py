"""A pipeline timeline from per-stage times: when each stage runs each micro-batch's forward and backward.

The cost model gives, per stage i, p_i (forward + backward of one micro-batch, recomputation included), o_j (the
boundary j → j+1: activation forward and its gradient back) and g_i (once per iteration: gradient sync and
optimizer). The timeline splits p_i as forward ≈ p_i / 3 and backward ≈ 2 p_i / 3 (a backward pass costs about
twice the forward's FLOPs; with recomputation the re-run forward is counted in the backward), and o_j evenly
between the activation send and the gradient send. Each stage runs its operations in the schedule's order
(GPipe: all forwards, then all backwards; 1F1B: P − i − 1 warm-up forwards, then one forward / one backward,
then the remaining backwards; interleaved 1F1B: rounds of P micro-batches through the stage's v chunks, with
torch's (v − 1)·P + 2·(P − 1 − i) warm-up forwards), each as soon as its input has arrived; idle time is the
bubble. The end is each
stage's gradient sync. This event simulation is a picture of the schedule; the predicted iteration time is the
cost model's TPI (`solve.program.tpi`), which it approximates.
"""

from __future__ import annotations

from dataclasses import dataclass

from uniap.errors import UniapError
from uniap.spec.workload import interleaved_order

FORWARD_SHARE = 1.0 / 3.0


@dataclass(frozen=True)
class Box:
    stage: int  # for sends: the sending stage of an activation, the receiving stage of a gradient (upper row)
    kind: str  # forward | backward | send | send-grad | sync | bubble
    micro: int  # micro-batch index (-1 for sync and bubble)
    start: float
    end: float
    chunk: int = -1  # the chunk (global index) a forward/backward runs, under the interleaved schedule

    @property
    def duration(self) -> float:
        return self.end - self.start


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The operations stage `stage` runs, in order: ("F", m) and ("B", m)."""
    c = micro_batches
    if schedule == "gpipe":
        return [("F", m) for m in range(c)] + [("B", m) for m in range(c)]
    if schedule != "1f1b":
        raise UniapError(f"unknown schedule {schedule!r} (gpipe or 1f1b)")
    warm = min(stages - stage - 1, c)
    ops = [("F", m) for m in range(warm)]
    for m in range(c - warm):
        ops += [("F", warm + m), ("B", m)]
    ops += [("B", m) for m in range(c - warm, c)]
    return ops


def simulate(schedule: str, p, o, g, micro_batches: int, virtual_stages: int = 1) -> list[Box]:
    """Boxes of one iteration: S·c forwards and backwards, (S−1)·c sends each way, P syncs, and the bubbles, for
    S = len(p) chunks on P = S / virtual_stages stages (chunk j on stage j mod P; S = P without interleaving)."""
    S, v = len(p), virtual_stages
    P = S // v if v >= 1 else 0
    if P < 1 or micro_batches < 1 or S % v:
        raise UniapError("a timeline needs at least one stage and one micro-batch")
    if len(o) != S - 1 or len(g) != P:
        raise UniapError(f"timeline: {S} stages (chunks) need {S - 1} boundary times and {P} sync times")
    fwd = [float(x) * FORWARD_SHARE for x in p]
    bwd = [float(x) * (1 - FORWARD_SHARE) for x in p]
    send = [float(x) / 2 for x in o]
    if v > 1:
        orders = [interleaved_order(i, P, micro_batches, v) for i in range(P)]
    else:
        orders = [[(kind, i, m) for kind, m in stage_order(schedule, i, P, micro_batches)] for i in range(P)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * P
    nxt = [0] * P
    boxes: list[Box] = []
    remaining = sum(len(x) for x in orders)
    chunk = (lambda j: j) if v > 1 else (lambda j: -1)
    while remaining:
        progressed = False
        for i in range(P):
            while nxt[i] < len(orders[i]):
                kind, j, m = orders[i][nxt[i]]
                if kind == "F":
                    dep = 0.0 if j == 0 else done.get(("F", j - 1, m))
                    ready = None if dep is None else dep + (send[j - 1] if j else 0.0)
                    length = fwd[j]
                else:
                    dep = done.get(("F", j, m)) if j == S - 1 else done.get(("B", j + 1, m))
                    ready = None if dep is None else dep + (send[j] if j < S - 1 else 0.0)
                    length = bwd[j]
                if ready is None:
                    break
                start = max(free[i], ready)
                if start > free[i]:
                    boxes.append(Box(i, "bubble", -1, free[i], start))
                end = start + length
                boxes.append(Box(i, "forward" if kind == "F" else "backward", m, start, end, chunk(j)))
                if kind == "F" and j < S - 1:
                    boxes.append(Box(i, "send", m, end, end + send[j]))
                if kind == "B" and j > 0:
                    boxes.append(Box((j - 1) % P, "send-grad", m, end, end + send[j - 1]))
                done[(kind, j, m)] = end
                free[i] = end
                nxt[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for GPipe, 1F1B and interleaved 1F1B orders
            raise UniapError("timeline: the schedule deadlocked")
    for i in range(P):
        boxes.append(Box(i, "sync", -1, free[i], free[i] + float(g[i])))
    return boxes


def makespan(boxes: list[Box]) -> float:
    return max((b.end for b in boxes), default=0.0)
