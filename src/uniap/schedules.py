"""Pipeline schedules: one class per schedule, stating in one place what every part of uniap needs to know.

A schedule says
- `check`: which pipelines it runs (stages P, micro-batches c, chunks per stage v);
- `order`: the operations a stage runs, in order, as torch.distributed.pipelining runs them — ("F", chunk, m)
  forwards, ("B", chunk, m) whole backwards, or, when it splits the backward, ("I", chunk, m) input gradients
  and ("W", chunk, m) weight gradients. The report's timeline, the event simulation the tests bound the cost
  formulas with, and the activation counts below are all read from it;
- `inflight` / `held_patterns`: what a stage's chunks hold in activations (a micro-batch's activations live from
  its forward to the end of its backward: "B", or "W" when the backward is split), derived from `order`;
- `torch_class`: the `torch.distributed.pipelining` class the runtime builds;
- `exports`: the schedule's name in each engine the plan can be exported to (absent: that engine lacks it);
- `simulate_order` (below): the event simulation of any schedule's order; `simulate_shared` the same on shared cores.
The time per iteration lives with the solver (`solve.program`): a closed form for each schedule, which the MILP
encodes; a schedule that splits the backward states its fill-and-drain term on equal chunks (`bubble`),
from which `solve.program` bounds it on any chunks.

Adding a schedule is one class here (and its entry in SCHEDULES), plus its tests. This module imports neither
torch nor the solver.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from uniap.errors import UniapError

Op = tuple[str, int, int]  # (kind, global chunk index, micro-batch)

FORWARD_SHARE = 1.0 / 3.0
"""A chunk's forward as a share of its forward + backward time (a backward costs about twice the forward's
FLOPs; recomputation is counted in the backward): how the event simulation splits a chunk's time."""


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule (see the module docstring); subclasses give `order`."""

    name: str
    """The name plans, the CLI and the Python API use."""
    title: str
    """How the report names it."""
    torch_class: str
    """The class of `torch.distributed.pipelining` that runs it."""
    interleaved: bool = False
    """Whether a stage may run several chunks (chunk j on stage `stage_of_chunk`: j mod P, or a V); its occupancy
    is then tracked per chunk (`held_patterns`)."""
    split_backward: bool = False
    """Whether the backward runs as an input-gradient part I and a weight-gradient part W."""
    same_peaks: bool = False
    """Whether every stage's occupancy peaks are stage 0's (`held_patterns` then walks one stage's order)."""
    exports: dict[str, str] = field(default_factory=dict, hash=False)
    """Engine → the schedule's name there (torchtitan's `pipeline_parallel_schedule`; "megatron" and "deepspeed"
    name the schedule their flags select)."""

    def check(self, stages: int, micro_batches: int, virtual_stages: int) -> None:
        """Raise UniapError when this schedule cannot run the pipeline."""
        if stages < 1 or micro_batches < 1:
            raise UniapError(f"a pipeline needs at least one stage and one micro-batch (got {stages}, {micro_batches})")
        if self.interleaved:
            _check_rounds(self, stages, micro_batches, virtual_stages)
        elif virtual_stages != 1:
            raise UniapError(f"the {self.name} schedule runs one chunk per stage, got {virtual_stages} virtual stages; "
                             f"interleaved-1f1b takes 2 or more")

    def order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        raise NotImplementedError

    def stage_of_chunk(self, chunk: int, stages: int) -> int:
        """The stage (device group) that runs global chunk `chunk`: chunk j on stage j mod P."""
        return chunk % stages

    def chunk_at(self, stage: int, position: int, stages: int) -> int:
        """The global chunk a stage runs at `position` (its position-th chunk, in chain order): whatever the
        placement, chunk j is at position j // P of its stage, so it is the one of position·P … position·P + P − 1
        that `stage_of_chunk` puts there: position·P + stage for j mod P."""
        return position * stages + stage

    def bubble(self, stages: int) -> tuple[tuple[float, float, float], ...]:
        """A schedule that splits the backward: its fill and drain on P stages of equal chunks, as linear pieces
        (a, b, d) of one chunk's forward F, input pass I and weight pass W. Over equal chunks its `order` then runs c
        micro-batches in c·v·(F + I + W) + max(a·F + b·I + d·W) (tests/solve/test_solve_zero_bubble.py holds the
        event simulation to it). None for a schedule that does not split it."""
        return ()

    def order_arrays(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1
                     ) -> tuple[np.ndarray, np.ndarray]:
        """`order` as two arrays, its kinds (one letter each) and its chunks: what the activation counts read."""
        ops = self.order(stage, stages, micro_batches, virtual_stages)
        return np.array([kind for kind, _, _ in ops]), np.array([chunk for _, chunk, _ in ops], dtype=int)

    def runs_as(self, stages: int, micro_batches: int) -> "Schedule":
        """The schedule the run actually follows (itself, unless its order degenerates into another's)."""
        return self

    def inflight(self, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[float]:
        """Per chunk (`chunk_at`): the micro-batches it holds at one moment of its stage's peak, the
        one where its stage's first backward starts (one moment, so never above the peak: the solver's bounds use
        it); the peak itself is the largest of `held_patterns`. For one chunk per stage it is the peak."""
        out = [0.0] * (stages * virtual_stages)
        occupancy = _occupancy(self.name, stages, self.bounded_rounds(stages, micro_batches), virtual_stages)
        for d, (_, first) in enumerate(occupancy):
            for k in range(virtual_stages):
                out[self.chunk_at(d, k, stages)] = float(first[k])
        return out

    def held_patterns(self, stages: int, micro_batches: int, virtual_stages: int) -> list[list[list[int]]]:
        """Per stage: the micro-batches each of its v chunks holds at once, at every moment no other moment
        dominates. The stage's peak memory is the largest of Σ_k held_k · (chunk k's activation bytes) over
        these: exact whatever the chunks' sizes."""
        occupancy = _occupancy(self.name, stages, self.bounded_rounds(stages, micro_batches), virtual_stages)
        return [[list(m) for m in peaks] for peaks, _ in occupancy]

    def bounded_rounds(self, stages: int, micro_batches: int) -> int:
        """Micro-batches whose order passes through every occupancy a longer run reaches: after the warm-up the
        streams cycle with a period of P micro-batches per chunk and the drain only releases, so four rounds of P
        suffice (a prefix of the order for any c)."""
        return min(micro_batches, 4 * stages)


def _check_rounds(schedule: Schedule, stages: int, micro_batches: int, virtual_stages: int) -> None:
    """Conditions of the round-based schedules: whole rounds of P micro-batches (Megatron-LM's requirement; it
    also meets torch's, c divisible by its number of rounds max(1, c // P)); interleaved ones need two groups
    and v ≥ 2. With fewer micro-batches than groups the pipeline never fills."""
    if schedule.name == "interleaved-1f1b":
        if virtual_stages < 2:
            raise UniapError(f"the interleaved schedule needs at least 2 virtual stages, got {virtual_stages}")
        if stages < 2:
            raise UniapError("the interleaved schedule needs a pipeline of at least 2 stages")
    elif virtual_stages < 1:
        raise UniapError(f"virtual stages must be >= 1, got {virtual_stages}")
    if micro_batches % stages:
        raise UniapError(f"the {schedule.name} schedule needs the micro-batch count ({micro_batches}) to be a "
                         f"multiple of the pipeline degree ({stages})")


@dataclass(frozen=True)
class GPipe(Schedule):
    """Every forward, then every backward (Huang et al. 2019): all c micro-batches alive at once."""

    def order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        c = micro_batches
        return [("F", stage, m) for m in range(c)] + [("B", stage, m) for m in range(c)]

    def bounded_rounds(self, stages: int, micro_batches: int) -> int:
        return micro_batches  # every micro-batch is alive before the first backward

    def inflight(self, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[float]:
        """Every stage holds all c micro-batches (what `order` gives; the search asks for it per candidate)."""
        return [float(micro_batches)] * stages


@dataclass(frozen=True)
class OneFOneB(Schedule):
    """PipeDream-flush (Narayanan et al. 2021): P − i − 1 warm-up forwards, then one forward / one backward, then
    the remaining backwards; stage i holds min(c, P − i) micro-batches."""

    def order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        c = micro_batches
        warm = min(stages - stage - 1, c)
        ops = [("F", stage, m) for m in range(warm)]
        for m in range(c - warm):
            ops += [("F", stage, warm + m), ("B", stage, m)]
        return ops + [("B", stage, m) for m in range(c - warm, c)]

    def runs_as(self, stages: int, micro_batches: int) -> Schedule:
        """With fewer micro-batches than stages, 1F1B's order is GPipe's (every forward precedes every backward)."""
        return GPIPE if micro_batches < stages else self

    def inflight(self, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[float]:
        """min(c, P − i) on stage i: what `order` gives, in closed form (the search asks for it per candidate)."""
        return [float(min(micro_batches, stages - i)) for i in range(stages)]


@dataclass(frozen=True)
class Interleaved1F1B(Schedule):
    """Interleaved 1F1B (Narayanan et al. 2021 §2.2): rounds of P micro-batches go through the stage's chunks
    0..v−1 forward and v−1..0 backward; after min(c·v, (v − 1)·P + 2·(P − 1 − i)) warm-up forwards they
    alternate (torch's `_get_warmup_ops`, as Megatron-LM)."""

    def order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        P, c, v = stages, micro_batches, virtual_stages
        rounds = [range(r * P, min((r + 1) * P, c)) for r in range(-(-c // P))]
        forwards = [("F", k * P + stage, m) for ms in rounds for k in range(v) for m in ms]
        backwards = [("B", k * P + stage, m) for ms in rounds for k in reversed(range(v)) for m in ms]
        warm = min(c * v, (v - 1) * P + 2 * (P - 1 - stage))
        ops = forwards[:warm]
        for f, b in zip(forwards[warm:], backwards):
            ops += [f, b]
        return ops + backwards[len(forwards) - warm:]

    def order_arrays(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1
                     ) -> tuple[np.ndarray, np.ndarray]:
        """`order`'s kinds and chunks without its tuples (a search asks for thousands of stages' orders): the
        forwards run round by round, chunk position k = 0..v−1 within a round, its micro-batches in turn; the
        backwards likewise with k reversed; after the warm-up one of each alternates."""
        P, c, v = stages, micro_batches, virtual_stages
        rounds, k, m = np.meshgrid(np.arange(-(-c // P)), np.arange(v), np.arange(P), indexing="ij")
        ran = rounds * P + m < c
        forward, backward = (k * P + stage)[ran], ((v - 1 - k) * P + stage)[ran]
        warm = min(c * v, (v - 1) * P + 2 * (P - 1 - stage))
        steady = c * v - warm
        kinds = np.concatenate([np.full(warm, "F"), np.tile(np.array(["F", "B"]), steady), np.full(warm, "B")])
        chunks = np.concatenate([forward[:warm], np.stack([forward[warm:], backward[:steady]], axis=1).ravel(),
                                 backward[steady:]])
        return kinds, chunks


@dataclass(frozen=True)
class ZeroBubble(Schedule):
    """Zero bubble, ZB1P of Qi et al. 2024 as torch's `ScheduleInterleavedZeroBubble` runs it, for v ≥ 1 chunks
    per stage (v = 1 is ZB-H1). The backward is split: an input-gradient pass I, which the stage upstream waits
    for, and a weight-gradient pass W, which no one waits for and which is deferred to fill the bubbles. After
    (v − 1)·P + (P − 1 − i) warm-up forwards, stage i runs F, I (and, from its (i+1)-th step, the W of its oldest
    pending I) and ends with the pending Ws. A micro-batch's activations stay until its W (torch keeps the
    graph of the input pass for the weight pass).

    Every stage's peaks are stage 0's (`same_peaks`): stage i has i fewer warm-up forwards and defers its weight
    passes i steps longer, and the chunk of the k-th forward or weight pass does not depend on the stage, so after
    its step k ≥ i it holds what stage 0 holds after its step k − i; before, less."""

    def order_arrays(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1
                     ) -> tuple[np.ndarray, np.ndarray]:
        """`order`'s kinds and chunks without its tuples (a search asks for thousands of stages' orders)."""
        return self._order(stage, stages, micro_batches, virtual_stages)[:2]

    def order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[Op]:
        kinds, chunks, micro = self._order(stage, stages, micro_batches, virtual_stages)
        return list(zip(kinds.tolist(), chunks.tolist(), micro.tolist()))

    def _order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(kinds, chunks, micro-batches) of the order: after the warm-up forwards, step k runs the forward
        warm + k (while any are left), the input pass k and, from step i on, the weight pass k − i (stage i defers
        its weight passes by i steps); then the weight passes left. The k-th forward (input pass) runs chunk
        position (k // per_round) % v (its reverse), micro-batch (k // (per_round·v))·per_round + k % per_round of
        it; the weight passes follow the input passes' order."""
        P, c, v = stages, micro_batches, virtual_stages
        per_round = c // max(1, c // P)
        warm = min((v - 1) * per_round + (P - 1 - stage), c * v)
        steps = c * v
        step = np.arange(steps)
        position = (step // per_round) % v
        forward, backward = position * P + stage, (v - 1 - position) * P + stage
        micro = (step // (per_round * v)) * per_round + step % per_round
        grid = np.stack([np.where(step < steps - warm, step + warm, -1), step,
                         np.where(step >= stage, step - stage, -1)], axis=1)  # (steps, F/I/W): which pass
        kinds = np.tile(np.array(["F", "I", "W"]), steps)
        which = grid.ravel()
        ran = which >= 0
        kinds, which = kinds[ran], which[ran]
        chunks = np.where(kinds == "F", forward[which], backward[which])
        tail = np.arange(max(steps - stage, 0), steps)
        return (np.concatenate([np.full(warm, "F"), kinds, np.full(len(tail), "W")]),
                np.concatenate([forward[:warm], chunks, backward[tail]]),
                np.concatenate([micro[:warm], micro[which], micro[tail]]))

    def bubble(self, stages: int) -> tuple[tuple[float, float, float], ...]:
        """The drain waits for a forward, for an input pass, or for both less the weight pass that the stage
        upstream runs meanwhile: max(F, I, F + I − W) on each of the P − 1 stages but the first."""
        q = float(stages - 1)
        return ((q, 0.0, 0.0), (0.0, q, 0.0), (q, q, -q))


@dataclass(frozen=True)
class VShaped(Schedule):
    """A schedule of two chunks per stage placed in a V (torch's `style="v"`): stage i runs chunk i on the way
    down and chunk 2P − 1 − i on the way back, so the last stage runs the two middle chunks back to back and the
    first stage holds both ends of the chain. It needs c ≥ 2P micro-batches (torch's DualPipeV does; ZBV below
    that leaves its steady state empty)."""

    def check(self, stages: int, micro_batches: int, virtual_stages: int) -> None:
        if virtual_stages != 2:
            raise UniapError(f"the {self.name} schedule runs two chunks per stage (--virtual-stages 2), got "
                             f"{virtual_stages}")
        if stages < 2:
            raise UniapError(f"the {self.name} schedule needs a pipeline of at least 2 stages")
        if micro_batches < 2 * stages:
            raise UniapError(f"the {self.name} schedule needs at least 2·P = {2 * stages} micro-batches, got "
                             f"{micro_batches}")

    def stage_of_chunk(self, chunk: int, stages: int) -> int:
        return chunk if chunk < stages else 2 * stages - 1 - chunk

    def chunk_at(self, stage: int, position: int, stages: int) -> int:
        return stage if position == 0 else 2 * stages - 1 - stage

    def bounded_rounds(self, stages: int, micro_batches: int) -> int:
        """2P: from c = 2P on, the warm-up and the drain do not depend on c, and each step of the steady state
        leaves every chunk holding what it held before it, so c = 2P passes through every occupancy a longer run
        does (tests/solve/test_schedules.py compares them up to c = 6P)."""
        return min(micro_batches, 2 * stages)


@dataclass(frozen=True)
class ZeroBubbleV(VShaped):
    """ZB-V (Qi et al. 2024 §6) as torch's `ScheduleZBVZeroBubble` orders it. Stage i warms up with 2(P − i) − 1
    forwards of its first chunk, then i pairs of both chunks' forwards, then P − i rounds of its second chunk's
    forward, input and weight pass; the steady state runs each chunk's F, I, W in turn; the drain runs the input
    passes and then the weight passes left."""

    def order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 2) -> list[Op]:
        P, c = stages, micro_batches
        first, second = stage, 2 * P - 1 - stage
        made = {first: 0, second: 0}  # forwards so far, per chunk
        done = {first: 0, second: 0}  # input passes so far
        ops: list[Op] = []

        def forward(chunk):
            ops.append(("F", chunk, made[chunk]))
            made[chunk] += 1

        def backward(chunk, weight=True):
            ops.append(("I", chunk, done[chunk]))
            if weight:
                ops.append(("W", chunk, done[chunk]))
            done[chunk] += 1

        rounds = max(2 * P - 1, c)  # torch fills a pipeline this long, then drops the micro-batches beyond c
        for _ in range(2 * (P - stage) - 1):
            forward(first)
        for _ in range(stage):
            forward(second)
            forward(first)
        for _ in range(P - stage):
            forward(second)
            backward(second)
        while made[second] < made[first] or made[first] < rounds:
            if made[first] < rounds:
                forward(first)
            backward(first)
            forward(second)
            backward(second)
        weighed = dict(done)  # weight passes so far, per chunk
        for _ in range(stage):
            backward(first, weight=False)
            backward(second, weight=False)
        for _ in range(P - stage):
            backward(first, weight=False)
            ops.append(("W", first, weighed[first]))
            weighed[first] += 1
        ops += [("W", second, m) for m in range(weighed[second], done[second])]
        ops += [("W", first, m) for m in range(weighed[first], done[first])]
        return [op for op in ops if op[2] < c]

    def bubble(self, stages: int) -> tuple[tuple[float, float, float], ...]:
        """Eight pieces, read off the event simulation of the order and checked on 775 equal-chunk pipelines
        (P ≤ 8): the drain waits for forwards, input passes or both, less the weight passes that fill it."""
        P = stages
        return ((0, 1, P - 2), (1, 0, P - 2), (0, P - 1, 0), (0, 2 * (P - 1), -2 * (P - 1)),
                (2 * P - 3, -(P - 2), 0), (2 * P - 3, 1, -2 * (P - 1)), (2 * P - 2, -(P - 1), -1),
                (2 * P - 2, 0, -(2 * P - 1)))


@dataclass(frozen=True)
class DualPipeV(VShaped):
    """DualPipeV (DeepSeek-V3's DualPipe cut in a V, Liu et al. 2024) as torch's `ScheduleDualPipeV` orders it:
    after its warm-up, each step runs one chunk's forward beside the other chunk's whole backward (torch runs the
    overlapped pair one after the other), and the drain splits the backwards of the last micro-batches into input
    and weight passes to fill the bubble."""

    def order(self, stage: int, stages: int, micro_batches: int, virtual_stages: int = 2) -> list[Op]:
        P, c = stages, micro_batches
        first, second = stage, 2 * P - 1 - stage
        counts: dict[tuple[int, str], int] = {}
        waiting: list[tuple[int, int]] = []  # (chunk, micro-batch) of input passes whose weight pass is due
        ops: list[Op] = []

        def run(chunk, kind):
            key = (chunk, "F" if kind == "F" else "I")  # a whole backward counts as an input pass
            m = counts.get(key, 0)
            counts[key] = m + 1
            ops.append((kind, chunk, m))
            if kind == "I":
                waiting.append((chunk, m))

        def weight():
            if waiting:
                chunk, m = waiting.pop(0)
                ops.append(("W", chunk, m))

        for _ in range(2 * (P - stage - 1)):
            run(first, "F")
        for _ in range(stage + 1):
            run(first, "F")
            run(second, "F")
        for _ in range(P - stage - 1):
            run(second, "I")
            weight()
            run(second, "F")
        for _ in range(c - 2 * P + stage + 1):
            run(first, "F")
            run(second, "B")
            run(second, "F")
            run(first, "B")
        for _ in range(P - stage - 1):
            run(second, "B")
            run(second, "F")
            run(first, "B")
        split = False  # the second half of the last backwards run as input passes
        for i in range(stage + 1):
            split = split or (i == (stage + 1) // 2 and stage % 2 == 1)
            run(second, "I" if split else "B")
            split = split or (i == (stage + 1) // 2 and stage % 2 == 0)
            run(first, "I" if split else "B")
        for _ in range(P - stage - 1):
            weight()
            run(first, "I" if split else "B")
        for _ in range(stage + 1):
            weight()
        return ops

    def bubble(self, stages: int) -> tuple[tuple[float, float, float], ...]:
        """Six pieces, read off the event simulation of the order and checked on 775 equal-chunk pipelines
        (P ≤ 8)."""
        q = stages - 1
        return ((-1, q, 0), (-1, 2 * q, -q), (q, 0, 0), (q, q, -q), (2 * q, -q, -q), (2 * q, 0, -2 * q))


GPIPE = GPipe("gpipe", "GPipe", "ScheduleGPipe", exports={"torchtitan": "GPipe"})
ONE_F_ONE_B = OneFOneB("1f1b", "1F1B", "Schedule1F1B",
                       exports={"torchtitan": "1F1B", "megatron": "1f1b", "deepspeed": "1f1b"})
INTERLEAVED_1F1B = Interleaved1F1B("interleaved-1f1b", "interleaved 1F1B", "ScheduleInterleaved1F1B",
                                   interleaved=True,
                                   exports={"torchtitan": "Interleaved1F1B", "megatron": "interleaved-1f1b"})
ZERO_BUBBLE = ZeroBubble("zero-bubble", "zero bubble (ZB1P)", "ScheduleInterleavedZeroBubble", interleaved=True,
                         split_backward=True, same_peaks=True, exports={"torchtitan": "InterleavedZeroBubble"})

ZERO_BUBBLE_V = ZeroBubbleV("zero-bubble-v", "zero bubble V (ZBV)", "ScheduleZBVZeroBubble", interleaved=True,
                            split_backward=True, exports={"torchtitan": "ZBVZeroBubble"})
DUALPIPE_V = DualPipeV("dualpipe-v", "DualPipeV", "ScheduleDualPipeV", interleaved=True, split_backward=True,
                       exports={"torchtitan": "DualPipeV"})

SCHEDULES: dict[str, Schedule] = {s.name: s for s in (GPIPE, ONE_F_ONE_B, INTERLEAVED_1F1B, ZERO_BUBBLE,
                                                      ZERO_BUBBLE_V, DUALPIPE_V)}
INTERLEAVED = INTERLEAVED_1F1B.name


DEFAULT = "default"
"""The default search: every schedule the solver prices, 1F1B, interleaved 1F1B (v ≥ 2), zero bubble (ZB1P,
v ≥ 1) and the V schedules (ZBV, DualPipeV: v = 2) together ("all" is the same search, the name it had while
the V schedules were left out). Each zero-bubble candidate is bounded by its device groups before any MILP
(solve.split_bound, and solve.group_bound's whole blocks over a level): on llama2-70b on 64 A100 the V schedules
add 0.1 s to a 1.4 s search, where each needed its chunk MILP (0.3 s) before the second bound."""
_EVERY = ("1f1b", INTERLEAVED, ZERO_BUBBLE.name, ZERO_BUBBLE_V.name, DUALPIPE_V.name)
SEARCHES: dict[str, tuple[str, ...]] = {
    DEFAULT: _EVERY, "all": _EVERY,
    **{name: ("1f1b", INTERLEAVED) if name == INTERLEAVED else (name,) for name in SCHEDULES}}
"""What `plan --schedule` searches: each name → the schedules whose candidates it solves."""


def searched_schedules(search: str) -> tuple[str, ...]:
    """The schedules `plan --schedule <search>` solves candidates of (`SEARCHES`); UniapError naming the choices."""
    if search not in SEARCHES:
        raise UniapError(f"unknown schedule search {search!r} (choose {', '.join(SEARCHES)})")
    return SEARCHES[search]


def schedule_named(name: str) -> Schedule:
    """The schedule called `name`; UniapError naming the choices otherwise."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise UniapError(f"unknown schedule {name!r} (choose {', '.join(SCHEDULES)})") from None


def exported_schedules(engine: str) -> dict[str, str]:
    """Our schedule names that `engine` runs -> its name for each."""
    return {s.name: s.exports[engine] for s in SCHEDULES.values() if engine in s.exports}


def chunks_per_stage(schedule: Schedule, virtual_stages: int) -> int:
    return virtual_stages if schedule.interleaved else 1


RELEASES = ("B", "W")
"""The operations that free a micro-batch's activations: its whole backward, or the weight pass of a split one."""


@functools.lru_cache(maxsize=8192)
def _occupancy(name: str, stages: int, micro_batches: int, virtual_stages: int
               ) -> tuple[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]], ...]:
    """Per stage: (its occupancy vectors that no other one covers, its occupancy when its first backward starts),
    from one pass over its order. Every candidate of a search asks again for its (P, c, v): cached per
    pipeline, not per stage (GPT-1T's search asks for about 150 pipelines of up to 128 stages each)."""
    if not SCHEDULES[name].same_peaks:
        return tuple(_stage_occupancy(name, d, stages, micro_batches, virtual_stages) for d in range(stages))
    peaks = _stage_occupancy(name, 0, stages, micro_batches, virtual_stages)[0]
    return tuple((peaks, _stage_occupancy(name, d, stages, micro_batches, virtual_stages, peaks=False)[1])
                 for d in range(stages))


def _stage_occupancy(name: str, stage: int, stages: int, micro_batches: int, virtual_stages: int,
                     peaks: bool = True) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """`_occupancy` of one stage: its chunks' occupancy after each of its forwards and releases (chunk j counts
    at position j // P). Only peaks can be uncovered: a moment after a forward that the next forward grows is
    covered by the next moment, and one after a release by the moment before it. `peaks` False: only the
    moment its first backward starts (and no peaks)."""
    schedule = SCHEDULES[name]
    v = chunks_per_stage(schedule, virtual_stages)
    kinds, chunks = schedule.order_arrays(stage, stages, micro_batches, v)
    later = np.flatnonzero(kinds != "F")
    warm_up = int(later[0]) if len(later) else len(kinds)  # forwards before the rest
    if not peaks:
        return (), tuple(np.bincount(chunks[:warm_up] // stages, minlength=v).tolist())
    step = np.where(kinds == "F", 1, np.where(np.isin(kinds, RELEASES), -1, 0))
    moved = np.flatnonzero(step)
    change = np.zeros((len(moved), v), dtype=int)
    change[np.arange(len(moved)), chunks[moved] // stages] = step[moved]
    states = np.cumsum(change, axis=0)
    totals = states.sum(axis=1)
    rises = np.concatenate([[True], totals[1:] > totals[:-1]])
    falls = np.concatenate([totals[1:] < totals[:-1], [True]])
    # distinct moments, in lexicographic order: each row read as one number in base (most held + 1), first
    # column most significant (np.unique over rows sorts the same, several times slower), where it fits 63 bits
    peaks_at = states[rises & falls]
    base = int(peaks_at.max(initial=0)) + 1
    if base ** v < 2 ** 62:
        keys = peaks_at @ (base ** np.arange(v - 1, -1, -1, dtype=np.int64))
        moments = peaks_at[np.unique(keys, return_index=True)[1]].reshape(-1, v)
    else:
        moments = np.unique(peaks_at, axis=0).reshape(-1, v)
    covered = np.zeros(len(moments), dtype=bool)
    for lo in range(0, len(moments), 256):  # the vectors are distinct: one ≥ another covers it
        block = moments[lo:lo + 256]
        above = (moments[None, :, :] >= block[:, None, :]).all(axis=2)  # [i, j]: moments[j] ≥ block[i]
        covered[lo:lo + 256] = above.sum(axis=1) > 1  # itself, and another
    return tuple(map(tuple, moments[~covered].tolist())), tuple(states[warm_up - 1].tolist())


@dataclass(frozen=True)
class Ran:
    """One operation of the event simulation: stage `stage` ran `kind` of chunk `chunk` for micro-batch `micro`."""

    stage: int
    kind: str  # F, B, I or W
    chunk: int
    micro: int
    start: float
    end: float


def simulate_order(schedule: Schedule, stages: int, micro_batches: int, virtual_stages: int, fwd, bwd, wgt, send
                   ) -> list[Ran]:
    """Run every stage's `order` as soon as its input has arrived: chunk j's forward after chunk j−1's forward
    and half the send between them, its backward (or input pass I) after chunk j+1's and the other half; a
    weight pass W after its own I. `fwd`, `bwd` per chunk (bwd the whole backward, I + W), `wgt` the weight
    pass's part of it per chunk (read only by schedules that split the backward), `send` per boundary (both
    directions). Each stage runs the chunks its order names (`stage_of_chunk`). Returns the operations in the order
    they were placed."""
    P, v = stages, chunks_per_stage(schedule, virtual_stages)
    orders = [schedule.order(i, P, micro_batches, v) for i in range(P)]
    ops = _Ops(P * v, fwd, bwd, wgt, send)
    free, nxt, out = [0.0] * P, [0] * P, []
    remaining = sum(len(x) for x in orders)
    while remaining:
        progressed = False
        for i in range(P):
            while nxt[i] < len(orders[i]):
                kind, j, m = orders[i][nxt[i]]
                ready, length = ops.ready(kind, j, m), ops.length(kind, j)
                if ready is None:
                    break
                start = max(free[i], ready)
                ops.done[(kind, j, m)] = free[i] = start + length
                out.append(Ran(i, kind, j, m, start, start + length))
                nxt[i] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise UniapError(f"the {schedule.name} order deadlocked (P={P}, c={micro_batches}, v={v})")
    return out


def simulate_shared(schedule: Schedule, stages: int, micro_batches: int, virtual_stages: int, fwd, bwd, wgt, send,
                    slowdown) -> float:
    """`simulate_order`'s pipeline when the stages share their hosts' cores: while n stages compute at once, each
    progresses at 1/slowdown(n) of its speed alone (a fair-share scheduler on CPU cores; sends and waits use no
    core). `fwd`, `bwd`, `wgt` are times alone. Returns the makespan. With slowdown ≡ 1 it is
    `simulate_order`'s."""
    P, v = stages, chunks_per_stage(schedule, virtual_stages)
    orders = [schedule.order(i, P, micro_batches, v) for i in range(P)]
    ops = _Ops(P * v, fwd, bwd, wgt, send)
    nxt = [0] * P
    running: list[list | None] = [None] * P  # [op, work left (seconds alone)]
    now, remaining = 0.0, sum(len(x) for x in orders)
    while remaining:
        arrivals = []
        for i in range(P):
            if running[i] is None and nxt[i] < len(orders[i]):
                op = orders[i][nxt[i]]
                ready = ops.ready(*op)
                if ready is not None and ready <= now:
                    running[i] = [op, ops.length(op[0], op[1])]
                    nxt[i] += 1
                elif ready is not None:
                    arrivals.append(ready)
        busy = [i for i in range(P) if running[i] is not None]
        if not busy:
            if not arrivals:
                raise UniapError(f"the {schedule.name} order deadlocked (P={P}, c={micro_batches}, v={v})")
            now = min(arrivals)
            continue
        rate = 1.0 / slowdown(len(busy))
        step = min(min(running[i][1] for i in busy) / rate, min(arrivals, default=np.inf) - now)
        now += step
        for i in busy:
            running[i][1] -= step * rate
            if running[i][1] <= 1e-12 * (1.0 + now):
                ops.done[running[i][0]] = now
                running[i] = None
                remaining -= 1
    return now


class _Ops:
    """The dependencies and lengths of a pipeline's operations (`simulate_order`), and when each has finished."""

    def __init__(self, chunks: int, fwd, bwd, wgt, send):
        self.S, self.fwd, self.bwd, self.wgt, self.send = chunks, fwd, bwd, wgt, send
        self.done: dict[tuple[str, int, int], float] = {}

    def ready(self, kind: str, j: int, m: int) -> float | None:
        """When the input of `kind` of chunk j for micro-batch m has arrived (None: not yet known)."""
        done, send, S = self.done, self.send, self.S
        if kind == "F":
            dep = 0.0 if j == 0 else done.get(("F", j - 1, m))
            return None if dep is None else dep + (send[j - 1] / 2 if j else 0.0)
        if kind == "W":
            return done.get(("I", j, m))
        dep = done.get(("F", j, m)) if j == S - 1 else done.get(("I", j + 1, m), done.get(("B", j + 1, m)))
        return None if dep is None else dep + (send[j] / 2 if j < S - 1 else 0.0)

    def length(self, kind: str, j: int) -> float:
        if kind == "F":
            return self.fwd[j]
        weight = min(self.wgt[j], self.bwd[j])
        return weight if kind == "W" else self.bwd[j] - (weight if kind == "I" else 0.0)
