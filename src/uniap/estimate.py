"""Predicted figures of an assignment (stage and strategy per layer), and the uniform hand configuration.

`estimate` costs what Megatron/torchtitan users write by hand (one tp/pp/dp/ZeRO for all layers, an
even split of the blocks); the planner and `estimate --plan` cost any assignment. All three go
through `cost.tables.build_program` and `solve.program.evaluate`, so one plan has one predicted time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from uniap.cost.tables import build_program, disallowed
from uniap.errors import UniapError
from uniap.schedules import schedule_named
from uniap.plans import LayerPlan, Plan, StagePlan
from uniap.program import StageProgram
from uniap.solve.program import evaluate, stage_times
from uniap.spec.cluster import ClusterSpec
from uniap.spec.model import ModelSpec
from uniap.spec.workload import EXPERT_IMBALANCE, Workload
from uniap.strategies import Strategy, uniform_fallbacks

EDGE_KINDS = ("embedding", "patch_embed", "head")


def uniform_split(model: ModelSpec, stages: int, virtual_stages: int = 1, schedule: str = "1f1b") -> np.ndarray:
    """Megatron's split: the body layers evenly over the stages, embedding on the first, head on the last. Under
    interleaving (`virtual_stages` v > 1; the result then numbers the P·v chunks, chunk j on the stage the
    `schedule` places it: j mod P, or a V, where the head's chunk is on the first stage) the
    blocks are balanced per stage first, each stage's share split evenly over its v chunks: Llama 3 405B's 126
    blocks on pp16·v7 give every stage 7 or 8 blocks, where an even split over the 112 chunks would put all 14
    doubled chunks on stages 0 and 8."""
    body = [u for u, layer in enumerate(model.layers) if layer.kind not in EDGE_KINDS]
    pieces = stages * virtual_stages
    if pieces > len(body):
        raise UniapError(f"{pieces} pipeline stages (chunks) exceed the {len(body)} blocks of {model.name}")
    per_stage = np.bincount([i * stages // len(body) for i in range(len(body))], minlength=stages)
    where = schedule_named(schedule).stage_of_chunk
    per_chunk = [per_stage[where(j, stages)] // virtual_stages
                 + (j // stages < per_stage[where(j, stages)] % virtual_stages)
                 for j in range(pieces)]  # a stage's leftover blocks go to its first chunks
    if min(per_chunk) < 1:
        raise UniapError(f"a stage of {min(per_stage)} blocks cannot run {virtual_stages} chunks")
    stage_of = np.zeros(len(model.layers), dtype=int)
    stage_of[body] = np.repeat(np.arange(pieces), per_chunk)
    for u, layer in enumerate(model.layers):
        if layer.kind in EDGE_KINDS:
            stage_of[u] = 0 if u < body[0] else pieces - 1
    return stage_of


def uniform_assignment(model: ModelSpec, stages: int, strategy: Strategy, micro_batch: int, virtual_stages: int = 1,
                       schedule: str = "1f1b") -> tuple[list[Strategy], np.ndarray, np.ndarray]:
    """One strategy for every layer, over the chain split over `stages` stages (P·v chunks under interleaving):
    recompute only where a layer can be recomputed, and the expert layout (ep, etp) on MoE layers only, as
    Megatron-LM and torchtitan apply them.

    Raises the first reason a layer cannot take the strategy (e.g. tp not dividing the heads).
    """
    strategies = uniform_fallbacks(strategy)
    strategy_of = np.zeros(len(model.layers), dtype=int)
    for u, layer in enumerate(model.layers):
        usable = [k for k, s in enumerate(strategies) if disallowed(layer, s, micro_batch) is None
                  and (not layer.experts or (s.ep, s.etp) == (strategy.ep, strategy.etp))]
        if not usable:
            raise UniapError(disallowed(layer, strategy, micro_batch))
        strategy_of[u] = usable[0]
    used = sorted(set(strategy_of.tolist()))
    return ([strategies[k] for k in used], uniform_split(model, stages, virtual_stages, schedule),
            np.searchsorted(used, strategy_of))


def as_planned(program: StageProgram, cluster: ClusterSpec, stage_of: np.ndarray,
               strategy_of: np.ndarray) -> StageProgram:
    """The tables of `program` as this plan runs them: a cost source's per-plan factor
    (`CostSource.plan_scale`: ranks that share cores contend by the plan's own stage times, where the search's
    tables assume balanced stages) on its per-micro-batch figures. `program` itself where there is none."""
    if cluster.costs is None or program.schedule is None or program.pipeline_degree <= 1:
        return program
    chunk_p = stage_times(program, stage_of, strategy_of).chunk_p
    scale = cluster.costs.plan_scale(cluster, program.schedule, program.pipeline_degree, program.micro_batches,
                                     program.virtual_stages, chunk_p)
    if scale == 1.0:
        return program
    weights = None if program.weight_gradient is None else program.weight_gradient * scale
    return replace(program, A=program.A * scale, R=program.R * scale, weight_gradient=weights)


def predict(model: ModelSpec, cluster: ClusterSpec, workload: Workload, program: StageProgram,
            stage_of: np.ndarray, strategy_of: np.ndarray) -> dict:
    """The `predicted` section of the plan contract (of the plan's own tables, `as_planned`)."""
    program = as_planned(program, cluster, stage_of, strategy_of)
    times = stage_times(program, stage_of, strategy_of)
    tpi = evaluate_unchecked(program, stage_of, strategy_of)
    work = float(times.chunk_p.sum()) * program.micro_batches  # every micro-batch through every chunk, spread over the groups
    bubble = max(0.0, 1.0 - work / (program.pipeline_degree * tpi)) if tpi > 0 else 0.0
    peak = times.memory + cluster.device.reserve_bytes
    model_flops = 3.0 * model.flops_per_sample() * workload.global_batch  # fwd + bwd, recompute not counted
    n = cluster.devices
    per_device = model_flops / tpi / n
    return {
        "iteration_time_s": tpi,
        "samples_per_s": workload.global_batch / tpi,
        "tokens_per_s": workload.global_batch * model.seq_len / tpi,
        "model_tflops_per_device": per_device / 1e12,
        "mfu": per_device / cluster.peak(workload.precision),
        "peak_memory_bytes": [int(m) for m in peak],
        "memory_capacity_bytes": int(cluster.device.memory_bytes),
        "fits": bool(np.all(times.memory <= program.memory_capacity)),
        "stage_time_s": [float(p) for p in times.p],
        "bubble_fraction": bubble,  # share of device time not spent on the stages' own work
    }


def evaluate_unchecked(program: StageProgram, stage_of: np.ndarray, strategy_of: np.ndarray) -> float:
    """TPI ignoring memory, so that a configuration that does not fit still gets a time (estimate reports both)."""
    return evaluate(replace(program, memory_capacity=np.inf), stage_of, strategy_of)


def make_plan(model: ModelSpec, cluster: ClusterSpec, workload: Workload, schedule: str, micro_batches: int,
              strategies: list[Strategy], stage_of: np.ndarray, strategy_of: np.ndarray, predicted: dict,
              search: dict | None = None, virtual_stages: int = 1) -> Plan:
    """`stage_of`: each layer's piece of the chain as the solver numbers it (its chunk under interleaving; chunk
    j at position j // P of the stage `Schedule.stage_of_chunk` names)."""
    pieces = int(stage_of.max()) + 1  # stages, or chunks under interleaving
    stages = pieces // virtual_stages
    ran = schedule_named(schedule)
    d = cluster.devices // stages
    stage_plans = []
    for i in range(stages):
        ranges = []
        for k in range(virtual_stages):
            members = np.flatnonzero(stage_of == ran.chunk_at(i, k, stages))
            ranges.append((int(members[0]), int(members[-1])))
        span = (min(r[0] for r in ranges), max(r[1] for r in ranges))
        stage_plans.append(StagePlan(i, tuple(range(i * d, (i + 1) * d)), span,
                                     tuple(ranges) if virtual_stages > 1 else ()))
    layers = [LayerPlan(u, layer.name, ran.stage_of_chunk(int(stage_of[u]), stages), strategies[int(strategy_of[u])],
                        int(stage_of[u]) if virtual_stages > 1 else None)
              for u, layer in enumerate(model.layers)]
    return Plan(
        model={"name": model.name, "layers": len(model.layers), "parameters": model.parameters,
               "seq_len": model.seq_len, "config": _config_json(model),
               **({"hf_config": model.hf_config} if model.hf_config is not None else {})},
        cluster={"name": cluster.name, "devices": cluster.devices, "nodes": cluster.nodes,
                 "devices_per_node": cluster.devices_per_node, "engine": cluster.engine.to_json()},
        workload=workload.to_json(),
        pipeline={"degree": stages, "micro_batches": micro_batches, "schedule": schedule,
                  "virtual_stages": virtual_stages},
        stages=stage_plans, layers=layers, predicted=predicted, search=search)


def _config_json(model: ModelSpec) -> dict:
    return model.config.to_json()


def cost_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> tuple[StageProgram, np.ndarray, np.ndarray]:
    """Tables and assignment of an existing plan, so `estimate --plan` re-costs it exactly."""
    plan.check_chain([layer.name for layer in model.layers], f"model {model.name}")
    workload = workload_of(plan)
    strategies = sorted({layer.strategy for layer in plan.layers})
    index = {s: k for k, s in enumerate(strategies)}
    stage_of = np.array([layer.position for layer in plan.layers])
    strategy_of = np.array([index[layer.strategy] for layer in plan.layers])
    micro = workload.global_batch // int(plan.pipeline.micro_batches)
    for layer, spec in zip(plan.layers, model.layers):
        why = disallowed(spec, layer.strategy, micro)
        if why:
            raise UniapError(f"plan layer {layer.index}: {why}")
    program = build_program(model, cluster, workload, len(plan.stages), int(plan.pipeline.micro_batches),
                            strategies, str(plan.pipeline.schedule), plan.virtual_stages)
    return program, stage_of, strategy_of


def workload_of(plan: Plan) -> Workload:
    w = plan.workload
    return Workload(int(w.global_batch), int(w.seq_len), str(w.precision),
                    float(EXPERT_IMBALANCE if w.expert_imbalance is None else w.expert_imbalance))


def estimate_uniform(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, tp: int = 1, pp: int = 1,
                     dp: int | None = None, zero: int = 0, micro_batch_size: int | None = None,
                     micro_batches: int | None = None, recompute: str | bool = "none",
                     sequence_parallel: bool = False, schedule: str = "1f1b", virtual_stages: int = 1, ep: int = 1,
                     etp: int = 1, cp: int = 1) -> Plan:
    """Cost a Megatron-style configuration: Megatron's micro-batch size is per device, so c = B / (dp·b).
    Interleaved 1F1B (`virtual_stages` > 1) splits the blocks evenly over the P·v chunks. `ep`/`etp` place
    the routed experts of an MoE model's MoE blocks (Megatron's --expert-model-parallel-size and
    --expert-tensor-parallel-size) on each stage's dp·cp·tp devices; `cp` splits each sequence
    (--context-parallel-size)."""
    n = cluster.devices
    if tp < 1 or pp < 1 or cp < 1:
        raise UniapError(f"--tp, --pp and --cp must be >= 1, got tp {tp}, pp {pp}, cp {cp}")
    if dp is None:
        if n % (tp * pp * cp):
            raise UniapError(f"tp·{'cp·' if cp > 1 else ''}pp = {tp * cp * pp} does not divide the {n} devices of "
                             f"{cluster.name}")
        dp = n // (tp * pp * cp)
    if dp * cp * tp * pp != n:
        names, degrees = ("dp·cp·tp·pp", (dp, cp, tp, pp)) if cp > 1 else ("dp·tp·pp", (dp, tp, pp))
        raise UniapError(f"{names} = {'·'.join(map(str, degrees))} = {dp * cp * tp * pp} but {cluster.name} has {n} "
                         f"devices")
    batch = workload.global_batch
    if micro_batches is not None and micro_batch_size is not None:
        raise UniapError("give --micro-batch-size or --micro-batches, not both")
    if micro_batches is None:
        mbs = micro_batch_size or 1
        if mbs < 1 or batch % (dp * mbs):
            raise UniapError(f"global batch {batch} does not split into dp {dp} × micro-batch size {mbs}")
        micro_batches = batch // (dp * mbs)
    if micro_batches < 1 or batch % micro_batches:
        raise UniapError(f"global batch {batch} does not split into {micro_batches} micro-batches")
    micro = batch // micro_batches
    if micro % dp:
        raise UniapError(f"a micro-batch of {micro} samples does not split over dp {dp}")
    if (ep > 1 or etp > 1) and not model.config.is_moe:
        raise UniapError(f"--ep and --etp place routed experts, and {model.name} has none")
    strategy = Strategy(dp=dp, tp=tp, zero=zero if dp * cp > 1 else 0, recompute=recompute, sp=sequence_parallel,
                        ep=ep, etp=etp, cp=cp)
    strategies, stage_of, strategy_of = uniform_assignment(model, pp, strategy, micro, virtual_stages, schedule)
    program = build_program(model, cluster, workload, pp, micro_batches, strategies, schedule, virtual_stages)
    predicted = predict(model, cluster, workload, program, stage_of, strategy_of)
    return make_plan(model, cluster, workload, schedule, micro_batches, strategies, stage_of, strategy_of, predicted,
                     virtual_stages=virtual_stages)
