"""uniap from Python: plan a model on a cluster, then lay a `transformers` model out as the plan says and train it.

    plan = uniap.plan(LlamaConfig(...), cluster="cpu:1x4", global_batch=8, seq_len=64)
    plan.save("plan.json")                      # Plan.load("plan.json") reads it back
    model = uniap.parallelize(LlamaForCausalLM(config), plan)   # on every rank, under torchrun
    optimizer = model.optimizer("adamw", lr=1e-3)
    loss = model.train_step(tokens, targets); optimizer.step(); optimizer.zero_grad()

The CLI's `plan` and `estimate` take their model, cluster and workload from `inputs`, and `uniap run` trains through
the same `ParallelModel` (`runtime/parallel_model.py`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

from uniap.errors import UniapError
from uniap.plans import Plan

def model_source(model) -> str | Path | dict:
    """What `spec.load_model` reads: a zoo name, a config.json path, or a Hugging Face config as a dict (from a
    `transformers` config or model)."""
    if isinstance(model, (str, Path, dict)):
        return model
    config = getattr(model, "config", model)  # a PreTrainedModel carries its config
    if hasattr(config, "to_json_string"):
        return json.loads(config.to_json_string(use_diff=False))
    raise UniapError(f"a model is a zoo name, a config.json path, a transformers config or model; got "
                     f"{type(model).__name__}")


def with_engine(cluster, kernels: str | None = None, attention: str | None = None):
    """`cluster` costed under these engine settings (kernels "eager"/"fused", attention "flash"/"standard"); each
    left out keeps the cluster's."""
    from uniap.spec.engine import Engine

    if kernels is None and attention is None:
        return cluster
    return replace(cluster, engine=Engine(kernels=kernels or cluster.engine.kernels,
                                          attention=attention or cluster.engine.attention))


def inputs(model, cluster: str, global_batch: int, seq_len: int | None = None, precision: str | None = None,
           profile: str | None = None, kernels: str | None = None, attention: str | None = None,
           engine: str | None = None):
    """(ModelSpec, ClusterSpec, Workload) of a planning question. The cluster is costed under the engine settings
    given (each left out keeps the cluster's) and calibrated by `profile` when one is given; without `precision`,
    the device's fastest precision among those `engine` (an export target) trains in."""
    from uniap.commands.options import resolve_precision
    from uniap.spec import load_model
    from uniap.spec.cluster import load_cluster
    from uniap.spec.workload import Workload

    spec = load_model(model_source(model), seq_len)
    clus = with_engine(load_cluster(cluster), kernels, attention)
    if engine is None:
        chosen = resolve_precision(precision, clus)
    else:
        from uniap.export import engine_rules

        chosen = resolve_precision(precision, clus, engine_rules(engine).precisions, engine)
    workload = Workload(global_batch, spec.seq_len, chosen)
    if profile is not None:
        from uniap.profile import calibrate

        clus = calibrate(clus, profile, model=spec, workload=workload)
    return spec, clus, workload


def plan(model, *, cluster: str, global_batch: int, seq_len: int | None = None, precision: str | None = None,
         schedule: str = "default", max_tp: int | None = None, max_cp: int | None = None,
         max_virtual_stages: int | None = None, time_limit: float | None = None, solver: str = "highs",
         workers: int | None = None, profile: str | None = None, kernels: str | None = None,
         attention: str | None = None, progress: Callable[[int, int, float], None] | None = None) -> Plan:
    """The fastest plan for `model` on `cluster` (a preset such as "cpu:1x4" or "a100-80g:8x8", or a YAML file):
    one MIQP per pipeline configuration, solved to proven optimality unless `time_limit` (seconds) ends it first.

    `model`: a zoo name, a config.json path, a `transformers` config or `PreTrainedModel` (its config is planned
    and carried in the plan, so that `uniap run --impl transformers` can build the class). `schedule`:
    "default" (or "all") searches 1F1B, interleaved 1F1B, zero bubble, ZBV and DualPipeV together;
    "interleaved-1f1b" the first two; a schedule's name that schedule alone. `progress(done,
    total, best_time_s)` is called as candidates finish. Bad input raises `uniap.UniapError` with one line."""
    from uniap.planner import MAX_VIRTUAL_STAGES, plan_search

    spec, clus, workload = inputs(model, cluster, global_batch, seq_len, precision, profile, kernels, attention)
    return plan_search(spec, clus, workload, schedule=schedule, solver=solver, time_limit=time_limit, max_tp=max_tp,
                       workers=workers, progress=progress, max_cp=max_cp,
                       max_virtual_stages=MAX_VIRTUAL_STAGES if max_virtual_stages is None else max_virtual_stages)


def parallelize(model, plan: Plan | str, *, sync_weights: bool = True, timeout_s: float = 600.0):
    """Lay a `transformers` `*ForCausalLM` out as `plan` says on this rank; call it on every rank inside torchrun.
    Returns a `ParallelModel`: `train_step(tokens, targets)`, `optimizer(kind, lr)`, `module`, `plan`. See
    `uniap.runtime.parallel_model.parallelize`."""
    from uniap.runtime.parallel_model import parallelize as lay_out

    return lay_out(model, plan, sync_weights=sync_weights, timeout_s=timeout_s)
