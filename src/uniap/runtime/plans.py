"""Hand-built plans: for tests and for running without the planner.

`uniform_plan` gives every layer the same strategy unless `per_layer` overrides some, splits the
chain into `pp` contiguous stages (evenly, or as `stage_layers` says) and gives stage i the ranks
i*d .. i*d+d-1 (d = world / pp).
"""

from __future__ import annotations

from dataclasses import replace

from uniap.errors import UniapError
from uniap.models.decoder import check_supported, layer_names
from uniap.plans import LayerPlan, Plan, StagePlan
from uniap.schedules import schedule_named
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy


def decoder_parameters(config: ModelConfig) -> int:
    """Parameter count of `uniap.models.decoder` for this config (no weights built): the spec's count, which
    the decoder matches option for option (tests/runtime/test_runtime_units.py)."""
    return build_layers(config, 1).parameters


def _even_split(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def uniform_plan(config: ModelConfig, world: int, *, pp: int = 1, dp: int | None = None, tp: int | None = None,
                 zero: int = 0, recompute: bool | str = False, sp: bool = False, micro_batches: int = 1,
                 schedule: str = "1f1b", global_batch: int = 8, seq_len: int = 32,
                 stage_layers: list[int] | None = None,
                 per_layer: dict[int | str, Strategy | dict] | None = None, precision: str = "fp32",
                 virtual_stages: int = 1, cp: int = 1, engine: dict | None = None,
                 hf_config: dict | None = None) -> Plan:
    """A valid Plan for `world` ranks.

    dp × cp × tp must equal world / pp (give dp or tp and the other follows; neither: data parallel over what cp
    leaves). `recompute`: a level of `strategies.RECOMPUTE_LEVELS` (or a bool: full or none). `engine`: the
    cluster's engine entry ({"attention": "standard"}, ...; None: none recorded, the runtime runs flash).
    `stage_layers`: layers per stage (sums to layers + 2) — per chunk under the interleaved schedule
    (`virtual_stages` v > 1: pp·v counts, chunk j on stage `Schedule.stage_of_chunk(j)`). `per_layer`: {chain index or layer name:
    Strategy or a dict of fields to change from the default strategy}, for mixed plans. `hf_config`: the Hugging
    Face config `config` was read from, for plans that run on transformers (`uniap run --impl transformers`).
    """
    if hf_config is None:
        check_supported(config)
    if pp < 1 or world % pp:
        raise UniapError(f"pipeline degree {pp} does not divide world size {world}")
    size = world // pp  # ranks per stage
    if cp < 1 or size % cp:
        raise UniapError(f"cp {cp} does not divide the {size} ranks of a stage")
    d = size // cp  # what dp × tp share
    if dp is None and tp is None:
        dp, tp = d, 1
    elif dp is None:
        if d % tp:
            raise UniapError(f"tp {tp} does not divide the {d} ranks of a stage per cp rank")
        dp = d // tp
    elif tp is None:
        if d % dp:
            raise UniapError(f"dp {dp} does not divide the {d} ranks of a stage per cp rank")
        tp = d // dp
    if dp * tp != d:
        raise UniapError(f"dp {dp} × cp {cp} × tp {tp} != {d * cp} ranks per stage")
    default = Strategy(dp=dp, tp=tp, zero=zero if dp * cp > 1 else 0, recompute=recompute, sp=sp and tp > 1, cp=cp)
    names = layer_names(config)
    n = len(names)
    pieces = pp * virtual_stages
    if stage_layers is None:
        if pieces > n:
            raise UniapError(f"{pieces} pipeline stages (chunks) exceed the {n} layers")
        stage_layers = _even_split(n, pieces)
    if len(stage_layers) != pieces or sum(stage_layers) != n or min(stage_layers) < 1:
        raise UniapError(f"stage_layers {stage_layers} must be {pieces} positive counts summing to {n}")
    strategies = [default] * n
    for key, value in (per_layer or {}).items():
        idx = names.index(key) if isinstance(key, str) and key in names else key
        if not isinstance(idx, int) or not 0 <= idx < n:
            raise UniapError(f"per_layer key {key!r} is not a layer of the chain")
        strategies[idx] = value if isinstance(value, Strategy) else replace(default, **value)
    ran = schedule_named(schedule)
    ranges, layers, first = [], [], 0
    for j, count in enumerate(stage_layers):
        last = first + count - 1
        ranges.append((first, last))
        for u in range(first, last + 1):
            layers.append(LayerPlan(index=u, name=names[u], stage=ran.stage_of_chunk(j, pp), strategy=strategies[u],
                                    chunk=j if virtual_stages > 1 else None))
        first = last + 1
    stages = []
    for s in range(pp):
        mine = tuple(ranges[ran.chunk_at(s, k, pp)] for k in range(virtual_stages))
        stages.append(StagePlan(index=s, ranks=tuple(range(s * size, (s + 1) * size)),
                                layers=(min(r[0] for r in mine), max(r[1] for r in mine)),
                                chunks=mine if virtual_stages > 1 else ()))
    plan = Plan(
        model={"name": config.name, "layers": n, "parameters": decoder_parameters(config), "seq_len": seq_len,
               "config": config.to_json(), **({"hf_config": hf_config} if hf_config is not None else {})},
        cluster={"name": "local", "devices": world, "nodes": 1, "devices_per_node": world,
                 **({"engine": engine} if engine is not None else {})},
        workload={"global_batch": global_batch, "seq_len": seq_len, "precision": precision},
        pipeline={"degree": pp, "micro_batches": micro_batches, "schedule": schedule,
                  "virtual_stages": virtual_stages},
        stages=stages,
        layers=layers,
    )
    plan.validate()
    return plan
