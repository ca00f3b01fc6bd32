"""The contract between the cost model and the solver: the cost tables of one pipeline configuration.

`cost.tables.build_program` fills a `StageProgram`; `solve` searches it and `solve.program.evaluate` prices a plan
of it. Both import it from here, so neither owns the other's input (the data flow is spec → cost → solve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from uniap.errors import UniapError
from uniap.schedules import FORWARD_SHARE


@dataclass(frozen=True)
class StageProgram:
    """Cost tables of one pipeline configuration: P stages of equal device count, c micro-batches."""

    A: np.ndarray  # (L, K) seconds, forward+backward of layer u under strategy k, per micro-batch
    G: np.ndarray  # (L, K) seconds once per iteration the pipeline does not hide (grad sync, optimizer)
    Ms: np.ndarray  # (L, K) static bytes per device (params, grads, optimizer states)
    Ma: np.ndarray  # (L, K) activation bytes per device per in-flight micro-batch
    R: np.ndarray  # (L-1, K, K) seconds, resharding between u (strategy k) and u+1 (k') in one stage, per micro-batch
    Rp: np.ndarray  # (L-1, K, K) seconds, sending u's output (and its gradient back) to the next stage, per micro-batch
    allowed: np.ndarray  # (L, K) bool; a False entry may not be chosen (e.g. tp does not divide heads)
    stages: int  # P
    micro_batches: int  # c
    inflight: np.ndarray  # (stages,) micro-batches whose activations stage (chunk) i holds at peak (c GPipe, min(c, P-i) 1F1B)
    memory_capacity: float  # bytes per device available to the plan
    group: np.ndarray  # (L,) int; consecutive layers with equal id are identical (same rows, same R between them;
    # edges between the same two ids hold the same R and Rp)
    virtual_stages: int = 1  # v: chunks per device group (interleaved 1F1B); `stages` counts chunks
    held: np.ndarray | None = None
    """(P, n, v) interleaved only: per device group, n occupancy vectors of its v chunks (micro-batches held at
    once, Schedule.held_patterns, zero rows as padding); its activation memory is the largest of
    Σ_k held[d, n, k]·Ma of chunk k·P + d. None: each chunk holds `inflight` (exact for plain pipelines), and
    `inflight` must then be at most the peak (the solver's bounds read it either way)."""
    weight_gradient: np.ndarray | None = None
    """(L, K) seconds of A that are the weight-gradient pass, for a schedule that splits the backward (None
    otherwise); `split_schedule` names it."""
    split_schedule: str | None = None
    """The schedule (`uniap.schedules`) that runs the backward as an input pass and a deferred weight pass; the
    program is then priced by `solve.program.split_backward_tpi`."""
    placement: np.ndarray | None = None
    """(stages,) the device group of each chunk, for a schedule that does not put chunk j on group j mod P (a V:
    `Schedule.stage_of_chunk`); None: j mod P. Whatever the placement, chunk j is its group's (j // P)-th."""
    schedule: str | None = None
    """The schedule the tables price, as it runs (GPipe for 1F1B with fewer micro-batches than stages): the
    solver reads `inflight`, `held` and `split_schedule` instead; a cost source's per-plan figures
    (`CostSource.plan_scale`) need the order itself. None: no such figures."""

    @property
    def chunk_groups(self) -> np.ndarray:
        """(stages,) the device group of each chunk."""
        if self.placement is not None:
            return np.asarray(self.placement, dtype=int)
        return np.arange(self.stages) % self.pipeline_degree

    @property
    def group_chunks(self) -> np.ndarray:
        """(P, v) the chunks of each device group, in chain order (its position-k chunk at [d, k])."""
        order = np.argsort(self.chunk_groups, kind="stable")
        return order.reshape(self.pipeline_degree, self.virtual_stages)

    @property
    def group_inflight(self) -> np.ndarray:
        """(P, v) `inflight` by device group and chunk position (`group_chunks`): what each group's chunks hold at
        one moment of its peak, the moment the solver's memory bounds price."""
        return np.asarray(self.inflight, dtype=float)[self.group_chunks]

    @property
    def group_moments(self) -> np.ndarray:
        """(P, n, v) micro-batches each chunk of each device group holds at once, per occupancy moment (`held`, or
        the in-flight counts as the one moment where the program has none)."""
        if self.held is not None:
            return np.asarray(self.held, dtype=float)
        return self.group_inflight[:, None, :]

    @property
    def pipeline_degree(self) -> int:
        """Device groups of the pipeline: stages / virtual_stages."""
        return self.stages // self.virtual_stages

    @property
    def layers(self) -> int:
        return int(np.shape(self.A)[0])

    @property
    def strategies(self) -> int:
        return int(np.shape(self.A)[1])

    def validate(self) -> None:
        """Raise UniapError (one line) unless the tables are well formed.

        Entries of disallowed strategies may hold anything (0, inf, nan); allowed ones must be finite and
        non-negative, because the solver's linearisation and its lower bounds rely on costs being >= 0.
        """
        A = np.asarray(self.A)
        if A.ndim != 2 or A.shape[0] < 1 or A.shape[1] < 1:
            raise UniapError(f"cost table A must be (layers, strategies), got shape {A.shape}")
        L, K = A.shape
        P = self.stages
        expected = {"G": (L, K), "Ms": (L, K), "Ma": (L, K), "allowed": (L, K), "R": (L - 1, K, K),
                    "Rp": (L - 1, K, K), "inflight": (P,), "group": (L,)}
        if not isinstance(P, (int, np.integer)) or P < 1:
            raise UniapError(f"stages must be a positive integer, got {P!r}")
        if P > L:
            raise UniapError(f"{P} pipeline stages cannot be filled by {L} layers")
        v = self.virtual_stages
        if not isinstance(v, (int, np.integer)) or v < 1 or P % v or (v > 1 and P // v < 2):
            raise UniapError(f"virtual_stages must be a positive divisor of the {P} stages leaving at least two "
                             f"device groups, got {v!r}")
        if not isinstance(self.micro_batches, (int, np.integer)) or self.micro_batches < 1:
            raise UniapError(f"micro_batches must be a positive integer, got {self.micro_batches!r}")
        for name, shape in expected.items():
            got = np.shape(getattr(self, name))
            if got != shape:
                raise UniapError(f"cost table {name} has shape {got}, expected {shape}")
        if np.asarray(self.allowed).dtype != bool:
            raise UniapError("allowed must be a boolean array")
        if not np.issubdtype(np.asarray(self.group).dtype, np.integer):
            raise UniapError("group must be an integer array")
        # What the solver reads: one row per run of identical layers and one edge per pair of groups (the
        # `group` contract), so a chain of a hundred identical blocks is checked once, not a hundred times.
        rows, edges = distinct_rows(self.group)[0], distinct_edges(self.group)[0]
        ok = np.asarray(self.allowed)
        for name in ("A", "G", "Ms", "Ma"):
            if not _finite_non_negative(np.asarray(getattr(self, name))[rows], ok[rows]):
                raise UniapError(f"cost table {name} has a negative or non-finite entry for an allowed strategy")
        pair_ok = ok[edges, :, None] & ok[edges + 1, None, :]
        for name in ("R", "Rp"):
            if not _finite_non_negative(np.asarray(getattr(self, name))[edges], pair_ok):
                raise UniapError(f"cost table {name} has a negative or non-finite entry between allowed strategies")
        infl = np.asarray(self.inflight, dtype=float)
        if not np.all(np.isfinite(infl) & (infl >= 0)):
            raise UniapError("inflight must be finite and non-negative")
        cap = float(self.memory_capacity)
        if math.isnan(cap) or cap <= 0:
            raise UniapError(f"memory_capacity must be positive, got {self.memory_capacity!r}")
        if self.held is not None:
            held = np.asarray(self.held, dtype=float)
            if held.ndim != 3 or held.shape[0] != self.pipeline_degree or held.shape[2] != v:
                raise UniapError(f"held must be (device groups, patterns, {v}), got shape {held.shape}")
            if not np.all(np.isfinite(held) & (held >= 0)):
                raise UniapError("held must be finite and non-negative")
        if self.placement is not None:
            groups = np.asarray(self.placement)
            if groups.shape != (P,) or not np.array_equal(np.bincount(groups, minlength=self.pipeline_degree),
                                                           np.full(self.pipeline_degree, v)):
                raise UniapError(f"placement must give each of the {self.pipeline_degree} device groups {v} of the "
                                 f"{P} chunks")
        if (self.weight_gradient is None) != (self.split_schedule is None):
            raise UniapError("weight_gradient and split_schedule go together")
        if self.weight_gradient is not None:
            w = np.asarray(self.weight_gradient, dtype=float)
            rest = (1 - FORWARD_SHARE) * A * (1 + 1e-12)  # the weight pass is part of the backward
            if w.shape != (L, K) or not _finite_non_negative(w, ok) or np.any(np.where(ok, w > rest, False)):
                raise UniapError(f"weight_gradient must be (layers, strategies) = {(L, K)}, within the backward's "
                                 f"share of A")


def distinct_rows(group) -> tuple[np.ndarray, np.ndarray]:
    """(first layer of each run of equal `group` ids, the run's length): the rows of a program's (L, K) tables
    that differ, and how many layers share each."""
    group = np.asarray(group)
    if not group.size:
        return np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
    return starts, np.diff(np.append(starts, group.size))


def distinct_edges(group) -> tuple[np.ndarray, np.ndarray]:
    """(first edge u (between layers u and u + 1) of each pair of groups, how many edges join that pair): edges
    between the same two groups hold the same R and Rp (the `group` contract)."""
    group = np.asarray(group)
    first: dict[tuple[int, int], int] = {}
    count: dict[tuple[int, int], int] = {}
    for u, key in enumerate(zip(group[:-1].tolist(), group[1:].tolist())):
        first.setdefault(key, u)
        count[key] = count.get(key, 0) + 1
    return np.array(list(first.values()), dtype=int), np.array([count[key] for key in first], dtype=int)


def _finite_non_negative(table, mask: np.ndarray) -> bool:
    """Every entry of `table` where `mask` holds is finite and >= 0 (two reductions: nan and ±inf reach them).
    Tables whose every entry passes (the cost model's, whose disallowed entries are 0) need no mask."""
    values = np.asarray(table, dtype=float)
    if values.size and values.min() >= 0 and np.isfinite(values.max()):
        return True
    values = np.where(mask, values, 0.0)
    if not values.size:
        return True
    lo, hi = values.min(), values.max()
    return bool(lo >= 0 and np.isfinite(hi))
