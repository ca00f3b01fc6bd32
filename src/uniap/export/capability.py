"""What a training engine can express, and a plan reduced to the terms every engine's configuration speaks.

Engines configure a job with one strategy for all transformer blocks (tensor, context, data and pipeline sizes, one
ZeRO level, one recomputation level: none, selective, selective-op or full) and a way to split the blocks into stages; in a
mixture of experts one expert layout (ep, etp) for every MoE block, the dense blocks running the same strategy
without one. The embedding and head run the blocks' strategy without recomputation (their cp included: every
layer sees its 1/cp of the sequence). `job_of` reduces a plan to that (`EngineJob`) or refuses it in one line
naming the first layer that differs (a block of another cp degree or recompute level included); `EngineRules.why_not`
says what a given engine cannot run of it, its model architecture, precision (fp8 included), recompute level and
context parallelism included. Both `uniap export` and the engine-restricted
search (`uniap plan --engine`) read these rules, so a plan the search returns is one the export accepts
(`EngineRules.pipeline_why_not`, a model the engine cannot pipeline, keeps the search to pp = 1).

Rank order: our stages are consecutive rank ranges with tp innermost, then cp, then dp, which is Megatron-LM's
default order (tp, cp, dp, pp from fastest to slowest), torchtitan's device meshes ["pp", "dp_replicate", "fsdp",
"tp"] with fsdp = dp_shard · cp and ["pp", "batch", "cp", "tp"] (0.2.2 `distributed/parallel_dims.py`) and
DeepSpeed's PipeDataParallelTopology (pipe outer, data inner; it has no cp).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from uniap.errors import UniapError
from uniap.plans import Plan
from uniap.spec.model import ModelConfig
from uniap.spec.zoo import ZOO
from uniap.strategies import Strategy

ANY_SPLIT = "any"
FIRST_LAST = "first-last"
EVEN = "even"


@dataclass(frozen=True)
class EngineJob:
    """A plan as an engine configures it: one strategy over the blocks and a split of the blocks into chunks."""

    model: str
    """The plan's model name (engines name models their own way; the writers map it)."""
    config: ModelConfig
    """The plan's architecture: what the writers turn into the engine's model settings."""
    world: int
    """Devices: tp · cp · dp · pp."""
    devices_per_node: int
    """Devices per node (what a launcher starts per node)."""
    tp: int
    """Tensor-parallel degree of every layer."""
    dp: int
    """Data-parallel degree of every layer."""
    pp: int
    """Pipeline stages (device groups)."""
    zero: int
    """ZeRO stage over the dp · cp ranks that hold the same parameters (0 when dp · cp is 1)."""
    sp: bool
    """Megatron sequence parallelism (only with tp > 1)."""
    ep: int
    """Expert-parallel degree of the MoE blocks (1 in a dense model)."""
    etp: int
    """Expert tensor-parallel degree of the MoE blocks (1 in a dense model)."""
    recompute: str
    """What every block recomputes in backward, one of `uniap.strategies.RECOMPUTE_LEVELS`: "none", "selective"
    (the attention core: scores, softmax, dropout; Megatron-LM's), "selective-op" (the element-wise operators and
    every second GEMM; torchtitan's per-op policy) or "full" (the whole block from its input). Embedding and head
    never recompute."""
    cp: int
    """Context-parallel degree of every layer: each sample's sequence split cp ways (load-balanced halves of a
    causal sequence); 1 without."""
    global_batch: int
    """Samples per iteration."""
    micro_batches: int
    """Micro-batches per iteration: pipeline micro-batches, or gradient-accumulation steps without a pipeline."""
    micro_batch_size: int
    """Samples per data-parallel rank per micro-batch: global_batch / (micro_batches · dp)."""
    seq_len: int
    """Tokens per sample."""
    precision: str
    """fp32, bf16 or fp16 (mixed precision with fp32 master weights), or fp8: bf16 mixed precision with the
    blocks' GEMMs in fp8 (the embedding and head stay bf16)."""
    schedule: str
    """gpipe, 1f1b or interleaved-1f1b."""
    virtual_stages: int
    """Chunks per pipeline stage (1 unless interleaved)."""
    chunk_blocks: tuple[int, ...]
    """Blocks in each of the pp · virtual_stages chunks, in chain order (chunk j on stage j mod pp); the
    embedding sits on chunk 0 and the head on the last."""

    @property
    def blocks(self) -> int:
        return sum(self.chunk_blocks)

    @property
    def replicas(self) -> int:
        """Ranks holding the same parameters: dp · cp, over which gradients are reduced and ZeRO shards."""
        return self.dp * self.cp

    @property
    def stage_blocks(self) -> tuple[int, ...]:
        """Blocks per pipeline stage, summed over its chunks."""
        return tuple(sum(self.chunk_blocks[j] for j in range(i, len(self.chunk_blocks), self.pp))
                     for i in range(self.pp))

    @property
    def strategy(self) -> Strategy:
        """The strategy of the MoE blocks (of every block in a dense model)."""
        return Strategy(self.dp, self.tp, self.zero, self.recompute, self.sp, self.ep, self.etp, self.cp)


def moe_blocks(config: ModelConfig) -> frozenset[int]:
    """The blocks (0-based) whose MLP is a mixture of experts."""
    return frozenset(config.moe_layers) if config.is_moe else frozenset()


def job_of(plan: Plan) -> EngineJob:
    """The plan as one block strategy and a block split; refuses (one line) a plan engines cannot configure."""
    names = [layer.name for layer in plan.layers]
    decoder = len(names) >= 3 and names[0] == "embed" and names[-1] == "head" and \
        all(name.startswith("block.") for name in names[1:-1])
    if not decoder:
        raise UniapError(f"export handles chains of embedding, blocks and head; {plan.model.name} is not one")
    blocks, config = plan.layers[1:-1], plan.model_config()
    moe = moe_blocks(config)
    shared = next((layer.strategy for i, layer in enumerate(blocks) if i in moe), blocks[0].strategy)
    dense = replace(shared, ep=1, etp=1) if moe else shared
    for i, layer in enumerate(blocks):
        if i in moe and layer.strategy != shared:
            raise UniapError(f"layer {layer.index} ({layer.name}) runs {layer.strategy.label()} but the first MoE "
                             f"block runs {shared.label()}: engines run one strategy over all MoE blocks"
                             f"{_differs(layer.strategy, shared)}")
        if i not in moe and layer.strategy != dense:
            runs = f"layer {layer.index} ({layer.name}) runs {layer.strategy.label()}"
            if moe:
                raise UniapError(f"{runs} but the MoE blocks run {shared.label()}: engines give a dense block that "
                                 f"strategy without expert parallelism ({dense.label()}){_differs(layer.strategy, dense)}")
            raise UniapError(f"{runs} but block.0 runs {shared.label()}: engines run one strategy over all blocks"
                             f"{_differs(layer.strategy, dense)}")
    edge = replace(dense, recompute="none")
    for layer in (plan.layers[0], plan.layers[-1]):
        if layer.strategy != edge:
            raise UniapError(f"layer {layer.index} ({layer.name}) runs {layer.strategy.label()} but the blocks run "
                             f"{shared.label()}: engines give it the blocks' strategy ({edge.label()})"
                             f"{_differs(layer.strategy, edge)}")
    pp, v = len(plan.stages), plan.virtual_stages
    devices = plan.world_size // pp
    if shared.devices * pp != plan.world_size:
        raise UniapError(f"the blocks' {shared.label()} on {pp} stages takes {shared.devices * pp} devices, the plan "
                         f"has {plan.world_size}: engines derive the data-parallel size from the world")
    for stage in plan.stages:
        if stage.ranks != tuple(range(stage.index * devices, (stage.index + 1) * devices)):
            raise UniapError(f"stage {stage.index} runs on ranks {list(stage.ranks)}: engines place stage i on "
                             f"ranks {stage.index * devices}..{(stage.index + 1) * devices - 1}")
    chunks = []
    for j in range(pp * v):
        first, last = plan.chunk_range(j)
        chunks.append(sum(1 for u in range(first, last + 1) if names[u].startswith("block.")))
    global_batch = int(plan.workload.global_batch)
    micro_batches = int(plan.pipeline.micro_batches)
    if global_batch % (micro_batches * shared.dp):
        raise UniapError(f"global batch {global_batch} does not split into {micro_batches} micro-batches over dp "
                         f"{shared.dp}")
    return EngineJob(
        model=str(plan.model.name), config=config, world=plan.world_size,
        devices_per_node=int(plan.cluster.devices_per_node or plan.world_size), tp=shared.tp, dp=shared.dp, pp=pp,
        zero=shared.zero, sp=shared.sp, ep=shared.ep, etp=shared.etp, recompute=shared.recompute, cp=shared.cp,
        global_batch=global_batch,
        micro_batches=micro_batches, micro_batch_size=global_batch // (micro_batches * shared.dp),
        seq_len=int(plan.workload.seq_len), precision=str(plan.workload.precision),
        schedule=str(plan.pipeline.schedule), virtual_stages=v, chunk_blocks=tuple(chunks))


def _differs(runs: Strategy, expected: Strategy) -> str:
    """What of the recomputation and context parallelism, which the labels abbreviate, differs (for a refusal)."""
    parts = []
    if runs.recompute != expected.recompute:
        parts.append(f"recompute {runs.recompute}, not {expected.recompute}")
    if runs.cp != expected.cp:
        parts.append(f"cp {runs.cp}, not {expected.cp}")
    return f" ({'; '.join(parts)})" if parts else ""


@dataclass(frozen=True)
class EngineRules:
    """What one engine can run of an `EngineJob`, from its source (each engine module cites where)."""

    name: str
    """The engine's name on the command line."""
    families: tuple[str, ...] | None
    """Model families the engine has an implementation of (None: any, the model being the user's code)."""
    precisions: tuple[str, ...]
    """Training precisions it offers (fp8: bf16 with the blocks' GEMMs in fp8)."""
    recompute_levels: tuple[str, ...]
    """The recompute levels (`RECOMPUTE_LEVELS`) it configures for every block."""
    context_parallel: bool
    """Whether its configuration has context parallelism (the sequence split cp ways, load-balanced)."""
    zero_stages: tuple[int, ...]
    """ZeRO stages it has over dp > 1 without a pipeline."""
    pipeline_zero_stages: tuple[int, ...]
    """ZeRO stages it allows together with pp > 1."""
    tensor_parallel: bool
    """Whether its own configuration has tensor parallelism."""
    sequence_parallel_always: bool
    """Tensor parallelism always comes with sequence parallelism (no plain tp)."""
    replicate_alone: bool
    """ZeRO-0 (replicated data parallelism) only when it is the one parallelism (no tp, cp or pp)."""
    pipeline_schedules: tuple[str, ...]
    """Schedules it runs with pp > 1."""
    split: str
    """How blocks may split over chunks: "any" (a module list per chunk), "first-last" (first and last stage
    set, the middle stages equal, a stage's chunks equal) or "even" (every stage the same)."""
    architecture_why_not: Callable[[ModelConfig], str | None]
    """What of a model of one of `families` the engine's model code lacks (None: it builds that model as
    planned), so that an export never trains a model other than the one the plan priced."""
    pipeline_why_not: Callable[[ModelConfig], str | None] | None = None
    """What of a model the engine cannot pipeline (pp > 1), where that differs from the model alone. The
    engine-restricted search does not see it: an export refuses such a plan."""
    expert_layout_why_not: Callable[[Strategy], str | None] | None = None
    """What of the MoE blocks' strategy (its ep and etp beside dp, cp, tp, sp) the engine cannot run, beyond ep
    dividing the experts (None: it has no expert parallelism)."""
    sequence_divisor: Callable[[Strategy], int] = lambda s: 1
    """What the sequence length must be a multiple of under strategy `s` (context parallelism's load balancing
    splits each sequence into 2 · cp chunks)."""
    job_why_not: Callable[["EngineJob"], str | None] | None = None
    """What of a whole job the rules above do not cover and the engine cannot run (the engine-restricted search
    does not see it: an export refuses such a plan)."""
    absent: dict[str, str] = field(default_factory=dict)
    """Why the engine lacks a feature a plan may use, by name ("fp8", a recompute level, "cp"): said in the refusal."""

    def _because(self, feature: str) -> str:
        return f": {self.absent[feature]}" if feature in self.absent else ""

    def why_not(self, job: EngineJob) -> str | None:
        """The first thing of `job` this engine cannot run, or None."""
        why = self.why_not_model(job.config, job.precision) or \
            self.strategy_why_not(job.strategy, job.pp, job.config.experts, job.seq_len)
        if why:
            return why
        if self.job_why_not:
            why = self.job_why_not(job)
            if why:
                return why
        if job.pp > 1 and job.schedule not in self.pipeline_schedules:
            return f"it has no {job.schedule} pipeline schedule ({', '.join(self.pipeline_schedules)})"
        if job.pp > 1 and self.pipeline_why_not:
            why = self.pipeline_why_not(job.config)
            if why:
                return why
        return self.split_why_not(job.chunk_blocks, job.pp)

    def why_not_model(self, config: ModelConfig, precision: str) -> str | None:
        """Why the engine cannot train this model in this precision (None if it can)."""
        if self.families is not None and config.family not in self.families:
            return f"it has no {config.family} model here (families {', '.join(self.families)})"
        if precision not in self.precisions:
            return f"it does not train in {precision} ({', '.join(self.precisions)}){self._because(precision)}"
        return self.architecture_why_not(config)

    def strategy_why_not(self, s: Strategy, pp: int, experts: int = 0, seq_len: int | None = None) -> str | None:
        """Why the engine cannot run strategy `s` on every block of a pp-stage pipeline (None if it can); in a
        model of `experts` routed experts, `s` is the MoE blocks' strategy (the dense blocks' without ep, etp);
        with `seq_len`, whether its sequences split as `s` needs."""
        if s.recompute not in self.recompute_levels:
            return f"it has no {s.recompute} recomputation (it recomputes {', '.join(self.recompute_levels)})" \
                   f"{self._because(s.recompute)}"
        if s.cp > 1 and not self.context_parallel:
            return f"its configuration has no context parallelism (the plan has cp {s.cp}){self._because('cp')}"
        if seq_len is not None and seq_len % self.sequence_divisor(s):
            return f"its sequences of {s.label()} must be a multiple of {self.sequence_divisor(s)} tokens (the plan " \
                   f"has {seq_len})"
        if s.moe and not experts:
            return f"the model has no experts for the plan's expert layout ({s.label()})"
        if experts:
            if experts % s.ep:
                return f"ep {s.ep} does not divide the model's {experts} experts"
            if s.moe and self.expert_layout_why_not is None:
                return f"it has no expert parallelism (the plan has {s.label()})"
            why = self.expert_layout_why_not(s) if self.expert_layout_why_not else None
            if why:
                return why
        if s.tp > 1 and not self.tensor_parallel:
            return f"its configuration has no tensor parallelism (the plan has tp {s.tp})"
        if s.tp > 1 and self.sequence_parallel_always and not s.sp:
            return "its tensor parallelism always shards the sequence (the plan has tp without sp)"
        if s.replicas > 1:
            stages = self.pipeline_zero_stages if pp > 1 else self.zero_stages
            if s.zero not in stages:
                where = " with a pipeline" if pp > 1 else ""
                return f"it has no ZeRO-{s.zero}{where} (ZeRO {', '.join(map(str, stages))})"
            if s.zero == 0 and self.replicate_alone and (s.tp > 1 or s.cp > 1 or pp > 1):
                return "its replicated data parallelism (ZeRO-0) cannot be combined with tp, cp or pp"
        return None

    def split_why_not(self, chunk_blocks: tuple[int, ...], pp: int) -> str | None:
        """Why the engine cannot place these block counts per chunk (None if it can)."""
        v = len(chunk_blocks) // pp
        stages = [[chunk_blocks[j] for j in range(i, len(chunk_blocks), pp)] for i in range(pp)]
        if self.split == ANY_SPLIT:
            return None
        if self.split == EVEN:
            if v > 1:
                return "it has no interleaved (virtual) pipeline stages"
            if len(set(chunk_blocks)) > 1:
                return f"it splits the blocks evenly over the stages, the plan has {list(chunk_blocks)}"
            return None
        for i, counts in enumerate(stages):
            if min(counts) < 1 or len(set(counts)) > 1:
                return f"stage {i} holds chunks of {counts} blocks: each of a stage's chunks gets the same number " \
                       f"(at least one)"
        middle = {counts[0] for counts in stages[1:-1]}
        if len(middle) > 1:
            return f"stages 1..{pp - 2} hold {[c[0] * v for c in stages[1:-1]]} blocks: the middle stages are equal"
        return None


@dataclass(frozen=True)
class Rope:
    """Rotary positions as a model was trained with them."""

    base: int
    """The frequency base (Hugging Face `rope_theta`)."""
    llama3_scaling: bool
    """Llama 3.1's frequency scaling (`rope_scaling` of type llama3: factor 8, low/high frequency factors 1 and 4,
    original length 8192), which both Megatron-LM's `--use-rope-scaling` and torchtitan's llama3 apply."""


PUBLISHED_ROPE = {"llama3-8b": Rope(500000, False), "llama3-70b": Rope(500000, False),
                  "llama3-405b": Rope(500000, True)}
"""The zoo's models whose RoPE is not the 10000 default (HF meta-llama/Meta-Llama-3-8B, -70B: rope_theta 500000;
Llama-3.1-405B: 500000 with rope_scaling of type llama3). The zoo's other RoPE models (Llama 2, the tiny ones)
rotate with base 10000."""


def rope_of(job: EngineJob) -> Rope | None:
    """The RoPE of a job's model, or None where the plan does not say: a ModelConfig records no rope_theta, so
    only a zoo model (name and architecture both the zoo's) is known. Llama 3 and 3.1 have the same
    architecture, so the figures cannot tell them apart."""
    if ZOO.get(job.model) != job.config:
        return None
    return PUBLISHED_ROPE.get(job.model, Rope(10000, False))


def block_layout_why_not(config: ModelConfig) -> str | None:
    """The block layouts neither Megatron-LM's GPT model nor torchtitan's llama3 and qwen3 build (or we do not export):
    parallel residuals, post or sandwich norms, sliding windows and soft-capping."""
    if config.parallel_residual:
        return "its blocks have no parallel residual (attention and MLP reading the same input)"
    if config.block_norms != "pre":
        return f"its blocks have pre-norms only (the model has {config.block_norms} norms)"
    if config.sliding_layers:
        return f"its export has no sliding-window attention (the model has a {config.sliding_window}-key window)"
    if config.attn_softcap or config.logit_softcap:
        return "its attention scores and logits have no soft-capping"
    return None


def refuse_unless_runnable(rules: EngineRules, job: EngineJob) -> None:
    """One line saying what of `job` the engine cannot run, if anything."""
    why = rules.why_not(job)
    if why:
        raise UniapError(f"{rules.name} cannot run this plan: {why}")

