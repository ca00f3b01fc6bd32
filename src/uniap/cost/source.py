"""Where cost tables get their figures: the analytic model, or a measured source handed in with the cluster.

`cost.tables.build_program` prices every layer and every pair of layouts analytically (cost.compute,
cost.comm, cost.memory) unless the cluster carries a CostSource (`ClusterSpec.costs`). A source answers
what it measured and returns None for the rest, which falls back to the analytic model. `uniap profile`
writes one (`profile.calibrate` turns the file into a source); this package never imports it, so costs
flow one way: measurements → source → tables.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from uniap.spec.cluster import ClusterSpec, Link
from uniap.spec.model import LayerSpec, ModelSpec
from uniap.spec.workload import Workload
from uniap.strategies import Strategy


class CostSource(Protocol):
    def holds(self, s: Strategy) -> bool:
        """Whether the source measured `s` on some layer: the search leaves the others out, since the analytic
        model that would price them knows nothing of the measured machine (and the solver would pick them for
        that error)."""

    def layer_cost(self, cluster: ClusterSpec, layer: LayerSpec, s: Strategy, micro_batch: int,
                   workload: Workload) -> tuple[float, float, float, float] | None:
        """(A, G, Ms, Ma) of `layer` under `s` for a micro-batch of `micro_batch` samples, or None if not measured."""

    def pair_tables(self, cluster: ClusterSpec, nbytes: float, strategies: list[Strategy], stages: int,
                    stage_link: Link, boundary_link: Link) -> tuple[np.ndarray, np.ndarray]:
        """(R, Rp) between every pair of strategies for an activation of `nbytes` (whole micro-batch)."""

    def adjust_tables(self, cluster: ClusterSpec, model: ModelSpec, workload: Workload, strategies: list[Strategy],
                      stages: int, micro_batches: int, schedule: str, virtual_stages: int, A: np.ndarray,
                      R: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
        """What a measured runtime adds to the per-layer figures of one pipeline configuration (P = `stages`,
        c = `micro_batches`, v = `virtual_stages` chunks per stage): (A, R, schedule)."""

    def plan_scale(self, cluster: ClusterSpec, schedule: str, stages: int, micro_batches: int, virtual_stages: int,
                   chunk_times: np.ndarray) -> float:
        """Factor on one plan's per-micro-batch figures beyond its configuration's `adjust_tables` (1: none), from
        the plan's own per-chunk seconds per micro-batch: `adjust_tables` is one figure per configuration, which
        the solver needs, and a plan's own stage times can say more (ranks sharing cores, `profile.calibration`)."""
