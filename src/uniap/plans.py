"""The plan file: the only contract between planning and running (schema `uniap.plan/1`).

A plan names the model (with its full architecture config, so the runtime can rebuild it), the
cluster, the workload, the pipeline, each stage's ranks and layer range, each layer's strategy, and
what the cost model predicts. The fingerprint ties a plan to one model and one world size.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from uniap.errors import UniapError
from uniap.jsonfile import read_json_object
from uniap.spec.engine import Engine
from uniap.spec.model import ModelConfig, architecture_id
from uniap.schedules import Schedule, schedule_named
from uniap.strategies import Strategy

SCHEMA = "uniap.plan/1"


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: the ranks that run it and the layers they hold."""

    index: int
    """Its place in the pipeline, 0 .. P − 1."""
    ranks: tuple[int, ...]
    """The global ranks that run it (dp × cp × tp of them)."""
    layers: tuple[int, int]
    """First and last (inclusive) layer index of the chain its chunks span."""
    chunks: tuple[tuple[int, int], ...] = ()
    """(first, last) of each chunk it runs, in order, under an interleaved schedule; () means one, `layers`."""

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """The contiguous layer ranges this stage runs: one, or v under the interleaved schedule."""
        return self.chunks or (self.layers,)


@dataclass(frozen=True)
class LayerPlan:
    """One layer of the chain: where it runs and how."""

    index: int
    """Its place in the chain."""
    name: str
    """Its name in the model (`embed`, `block.3`, `head`), which the runtime checks against the model it builds."""
    stage: int
    """The stage that runs it."""
    strategy: Strategy
    """Its parallel strategy (dp, cp, tp, ZeRO, recompute, ...)."""
    chunk: int | None = None
    """Its global chunk index under an interleaved schedule (on the stage `Schedule.stage_of_chunk` names, at
    position chunk // P); None otherwise."""

    @property
    def position(self) -> int:
        """The piece of the chain this layer belongs to: its chunk, or its stage when there are no chunks."""
        return self.stage if self.chunk is None else self.chunk


def _section(cls, data, what: str):
    """A plan section from its JSON object (a section passes through); unknown fields are refused by name."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise UniapError(f"malformed plan: {what} must be an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise UniapError(f"malformed plan: unknown {what} field(s) {unknown} (known: {', '.join(sorted(names))})")
    return cls(**data)


class _Section:
    """A plan section's JSON: its fields, those left None omitted (plans without them stay as they were)."""

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ModelSection(_Section):
    """The model a plan is for."""

    name: str
    """Its name (zoo name, or the config's `_name_or_path`)."""
    layers: int
    """Layers of its chain (embedding, blocks, head)."""
    parameters: int
    """Parameters, a tied embedding counted once."""
    seq_len: int
    """Tokens per sequence the plan is for."""
    config: dict
    """The architecture (`ModelConfig` as JSON), so that the runtime can rebuild the model."""
    hf_config: dict | None = None
    """The Hugging Face config it was read from, if any (`uniap run --impl transformers` builds its class)."""


@dataclass(frozen=True)
class ClusterSection(_Section):
    """The devices a plan is for."""

    name: str
    """Preset and shape (`a100-80g:8x8`) or the YAML file's name."""
    devices: int
    """Devices in all: the world size the plan runs on."""
    nodes: int = 1
    """Machines."""
    devices_per_node: int | None = None
    """Devices per machine (None: all on one)."""
    engine: dict | None = None
    """The engine the plan was costed under ({kernels, attention, ...}; None in plans older than the setting)."""


@dataclass(frozen=True)
class WorkloadSection(_Section):
    """What one iteration trains."""

    global_batch: int
    """Sequences per iteration."""
    seq_len: int
    """Tokens per sequence."""
    precision: str = "fp32"
    """fp32, bf16 or fp16 mixed precision, or fp8 GEMMs."""
    expert_imbalance: float | None = None
    """Tokens of the busiest expert over the mean (MoE models; None: none recorded)."""


@dataclass(frozen=True)
class PipelineSection(_Section):
    """How the stages run."""

    degree: int
    """Pipeline stages P."""
    micro_batches: int
    """Micro-batches per iteration c."""
    schedule: str = "1f1b"
    """A name of `uniap.schedules.SCHEDULES`: gpipe, 1f1b, interleaved-1f1b or zero-bubble."""
    virtual_stages: int = 1
    """Chunks per stage v (interleaved 1F1B: 2 or more; zero bubble: 1 or more; 1 otherwise)."""


@dataclass(frozen=True)
class IntervalSection(_Section):
    """The uncertainty of a calibrated prediction (`uniap.intervals`; the statistics: `uniap.profile.uncertainty`):
    where the iteration time should fall, from the spread of the profile the plan was costed with."""

    low_s: float
    """Low end of the interval on the iteration time (seconds)."""
    high_s: float
    """High end (seconds); the point prediction is `predicted.iteration_time_s`."""
    level: float
    """Nominal two-sided coverage (0.9: a 90 % prediction interval)."""
    replicates: int
    """Replicate profiles the spread was measured over (passes, or repetitions of a one-pass profile)."""
    kind: str
    """What the replicates are: "passes" or "repetitions"."""
    replicate_s: tuple[float, ...]
    """The plan's iteration time costed with each replicate alone (seconds)."""
    method: str
    """How the interval was derived, in words."""
    profile: str | None = None
    """The profile file it was derived from (None: a profile given as a document)."""
    model_error: float | None = None
    """Relative σ of the cost model's own error, beyond the profile's noise, that the interval holds (None: not
    measured for the profile's kind of device, or a plan written before it was)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicate_s", tuple(float(x) for x in self.replicate_s))
        if not 0.0 <= float(self.low_s) <= float(self.high_s):
            raise UniapError(f"malformed plan: interval {self.low_s}..{self.high_s} is not 0 <= low <= high")

    def to_json(self) -> dict:
        out = super().to_json()
        out["replicate_s"] = list(self.replicate_s)
        return out


_SECTIONS = {"model": ModelSection, "cluster": ClusterSection, "workload": WorkloadSection,
             "pipeline": PipelineSection}


@dataclass(frozen=True)
class Plan:
    """A plan, never changed once built (`dataclasses.replace` makes another). Its sections may be given as
    their JSON objects; they are typed on construction."""

    model: ModelSection
    """The model it is for."""
    cluster: ClusterSection
    """The devices it is for."""
    workload: WorkloadSection
    """What one iteration trains."""
    pipeline: PipelineSection
    """How the stages run."""
    stages: list[StagePlan]
    """The pipeline stages, in order."""
    layers: list[LayerPlan]
    """Every layer of the chain, in order."""
    predicted: dict = field(default_factory=dict)
    """What the cost model predicts (iteration_time_s, peak_memory_bytes per stage, ...); {} when not costed."""
    search: dict | None = None
    """What the search proved (solver, time, optimality, gap, ...); None for plans not searched."""
    interval: IntervalSection | None = None
    """The uncertainty interval of `predicted.iteration_time_s` when costed with a profile that records its
    spread (`uniap.intervals`); None otherwise and in plans older than the field."""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            object.__setattr__(self, name, _section(cls, getattr(self, name), name))
        if self.interval is not None:
            object.__setattr__(self, "interval", _section(IntervalSection, self.interval, "interval"))

    # -- identity -------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return int(self.cluster.devices)

    @property
    def virtual_stages(self) -> int:
        return int(self.pipeline.virtual_stages)

    @property
    def engine(self) -> Engine | None:
        """The engine the plan was costed under (None for plans written before the setting existed)."""
        data = self.cluster.engine
        return Engine.from_json(data, Engine()) if data is not None else None

    @property
    def schedule(self) -> Schedule:
        """The pipeline schedule it runs (`uniap.schedules`)."""
        return schedule_named(str(self.pipeline.schedule))

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """(first, last) layer of global chunk `chunk`: on the stage its schedule places it, at position chunk // P."""
        P = len(self.stages)
        return self.stages[self.schedule.stage_of_chunk(chunk, P)].ranges[chunk // P]

    def engine_or(self, default: Engine) -> Engine:
        """The engine the plan runs under: its own, or, for a plan that records none, `default`'s kernels with
        flash attention, the kernel `uniap run` runs such a plan with (so `estimate --plan` prices what runs)."""
        return self.engine if self.engine is not None else replace(default, attention="flash")

    def model_config(self) -> ModelConfig:
        try:
            return ModelConfig(**self.model.config)
        except TypeError as exc:
            raise UniapError(f"plan's model config is malformed: {exc}") from None

    @property
    def fingerprint(self) -> str:
        """`spec.model.architecture_id` of its model, sequence length and world size."""
        return architecture_id(self.model_config(), int(self.model.seq_len), self.world_size)

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        out = {
            "schema": SCHEMA,
            "fingerprint": self.fingerprint,
            "model": self.model.to_json(),
            "cluster": self.cluster.to_json(),
            "workload": self.workload.to_json(),
            "pipeline": self.pipeline.to_json(),
            "stages": [{"index": s.index, "ranks": list(s.ranks), "layers": list(s.layers),
                        "chunks": [list(c) for c in s.ranges]} for s in self.stages],
            "layers": [{"index": l.index, "name": l.name, "stage": l.stage, "chunk": l.position,
                        "strategy": l.strategy.to_json()} for l in self.layers],
            "predicted": self.predicted,
        }
        if self.search is not None:
            out["search"] = self.search
        if self.interval is not None:
            out["interval"] = self.interval.to_json()
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps() + "\n")

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise UniapError(f"not a uniap plan (expected schema {SCHEMA!r})")
        try:
            interleaved = int(dict(data["pipeline"]).get("virtual_stages", 1)) > 1  # else chunks are the stages
            plan = cls(
                model=data["model"],
                cluster=data["cluster"],
                workload=data["workload"],
                pipeline=data["pipeline"],
                stages=[StagePlan(int(s["index"]), tuple(int(r) for r in s["ranks"]),
                                  (int(s["layers"][0]), int(s["layers"][1])),
                                  tuple((int(c[0]), int(c[1])) for c in s["chunks"]) if interleaved else ())
                        for s in data["stages"]],
                layers=[LayerPlan(int(l["index"]), str(l["name"]), int(l["stage"]),
                                  Strategy.from_json(l["strategy"]), int(l["chunk"]) if interleaved else None)
                        for l in data["layers"]],
                predicted=dict(data.get("predicted", {})),
                search=data.get("search"),
                interval=data.get("interval"),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UniapError(f"malformed plan: missing or bad field {exc}") from None
        plan.validate()
        plan.engine  # a malformed engine is refused here, in one line
        given = data.get("fingerprint")
        if given is not None and given != plan.fingerprint:
            raise UniapError("plan fingerprint does not match its model/cluster (edited by hand?)")
        return plan

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        data = read_json_object(path, "plan")
        return cls.from_json(data)

    # -- consistency ----------------------------------------------------------------------------
    def validate(self) -> None:
        """Structural checks a hand-edited plan must pass before anything runs it."""
        n = self.world_size
        degree = int(self.pipeline.degree)
        if degree != len(self.stages) or degree < 1:
            raise UniapError(f"pipeline degree {degree} but {len(self.stages)} stages listed")
        if n % degree:
            raise UniapError(f"pipeline degree {degree} does not divide the {n} devices")
        if int(self.pipeline.micro_batches) < 1:
            raise UniapError(f"micro_batches must be >= 1, got {self.pipeline.micro_batches}")
        schedule, v = self.pipeline.schedule, self.virtual_stages
        schedule_named(schedule).check(degree, int(self.pipeline.micro_batches), v)
        ranks = sorted(r for s in self.stages for r in s.ranks)
        if ranks != list(range(n)):
            twice = sorted({r for r in ranks if ranks.count(r) > 1})
            missing = sorted(set(range(n)) - set(ranks))
            raise UniapError(f"stage ranks must cover 0..{n - 1} exactly once: {len(ranks)} listed"
                             + (f", missing {missing[:5]}" if missing else "") + (f", twice {twice[:5]}" if twice else ""))
        wrong = [(stage.index, len(stage.ranges)) for stage in self.stages if len(stage.ranges) != v]
        if wrong:
            raise UniapError(f"every stage must run {v} chunk(s); stage {wrong[0][0]} runs {wrong[0][1]}")
        expect = 0
        ran = schedule_named(schedule)
        for j in range(degree * v):  # chunk j at position j // P of its stage; the chunks cover the chain in order
            i = ran.stage_of_chunk(j, degree)
            stage = self.stages[i]
            first, last = stage.ranges[j // degree]
            if stage.index != i or first != expect or last < first:
                raise UniapError(f"stage {i}: layers must be contiguous and ordered (got {first}..{last})")
            expect = last + 1
        model_layers = int(self.model.layers)
        if len(self.layers) != model_layers:
            listed = {layer.index for layer in self.layers}
            missing = [u for u in range(model_layers) if u not in listed]
            raise UniapError(f"the plan lists {len(self.layers)} layers but its model has {model_layers}"
                             + (f" (missing: {', '.join(map(str, missing[:5]))})" if missing else ""))
        if expect != model_layers:
            raise UniapError(f"the stages cover layers 0..{expect - 1} ({expect}) but the model has {model_layers}")
        for layer in self.layers:
            stage = self.stages[layer.stage] if 0 <= layer.stage < degree else None
            chunk = layer.position
            inside = stage is not None and 0 <= chunk < degree * v \
                and ran.stage_of_chunk(chunk, degree) == layer.stage \
                and stage.ranges[chunk // degree][0] <= layer.index <= stage.ranges[chunk // degree][1]
            if not inside:
                raise UniapError(f"layer {layer.index} ({layer.name}) is not inside its stage {layer.stage}")
            if layer.strategy.devices != len(stage.ranks):
                raise UniapError(f"layer {layer.index}: dp×cp×tp = {layer.strategy.devices} but its stage has "
                                 f"{len(stage.ranks)} ranks")

    def check_chain(self, names: list[str], of: str) -> None:
        """Refuse a plan whose layers are not `names`, the chain of `of` (the model it is costed or run as), with
        both counted: a plan whose model section was edited along with its layers passes `validate`."""
        mine = [layer.name for layer in self.layers]
        if mine == names:
            return
        if len(mine) != len(names):
            raise UniapError(f"the plan lists {len(mine)} layers ({_ends(mine)}) but {of} has {len(names)} "
                             f"({_ends(names)})")
        u = next(u for u, (a, b) in enumerate(zip(mine, names)) if a != b)
        raise UniapError(f"the plan's layer {u} is {mine[u]!r} but layer {u} of {of} is {names[u]!r}")

    def check_matches(self, config: ModelConfig, seq_len: int, world_size: int) -> None:
        """Refuse to run a plan made for another model or world size."""
        if world_size != self.world_size:
            raise UniapError(f"plan is for {self.world_size} ranks but the world has {world_size}")
        if architecture_id(config, seq_len, world_size) != self.fingerprint:
            raise UniapError(f"plan was made for model {self.model.name!r}, not {config.name!r}")


def _ends(names: list[str]) -> str:
    """A chain of layer names by its ends: "embed, block.0, …, head"."""
    return ", ".join(names) if len(names) <= 3 else f"{names[0]}, {names[1]}, …, {names[-1]}"
