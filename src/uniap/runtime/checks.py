"""What the runtime demands of a plan before any process group exists: one clear UniapError each.

`check_plan` runs on every rank (and in the launcher, before spawning) and returns the derived
facts the rest of the runtime uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from uniap.schedules import schedule_named
from uniap.errors import UniapError
from uniap.models.decoder import check_supported, layer_names
from uniap.plans import Plan
from uniap.runtime.precision import precision_of
from uniap.spec.engine import Engine
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy

RUN_RECOMPUTE = ("none", "selective", "selective-op", "full")


@dataclass(frozen=True)
class RunShape:
    """Facts derived from a checked plan."""

    plan: Plan
    config: ModelConfig
    world: int
    pp: int
    stage_size: int  # ranks per stage (all stages equal)
    global_batch: int
    micro_batches: int
    micro_batch: int  # samples per micro-batch
    seq_len: int
    schedule: str  # the schedule actually run (a name of `uniap.schedules.SCHEDULES`)
    virtual_stages: int = 1  # chunks per stage (interleaved 1F1B, zero bubble)
    precision: str = "fp32"  # the plan's workload precision: "fp32", "bf16" or "fp16" (see precision.py)
    attention: str = "flash"  # the attention kernel of the plan's engine (plans without one: flash)

    def strategy(self, layer: int) -> Strategy:
        return self.plan.layers[layer].strategy

    def stage_of_chunk(self, chunk: int) -> int:
        """The stage that runs global chunk `chunk` (`Schedule.stage_of_chunk`: j mod pp, or a V)."""
        return schedule_named(self.schedule).stage_of_chunk(chunk, self.pp)

    @property
    def head_stage(self) -> int:
        """The stage that runs the chain's last chunk (the head): pp − 1, or 0 under a V schedule."""
        return self.stage_of_chunk(self.pp * self.virtual_stages - 1)

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """(first, last) layer of global chunk `chunk` (on its stage, at position chunk // pp)."""
        return self.plan.chunk_range(chunk)

    def stage_of_rank(self, rank: int) -> tuple[int, int]:
        """(stage index, position of `rank` inside the stage's rank list)."""
        for stage in self.plan.stages:
            if rank in stage.ranks:
                return stage.index, stage.ranks.index(rank)
        raise UniapError(f"rank {rank} is in no stage of the plan")


def check_plan(plan: Plan, world_size: int, impl: str = "uniap") -> RunShape:
    """`impl`: the model the plan runs on, "uniap" (our decoder) or "transformers" (`hf.py`)."""
    plan.validate()
    config = plan.model_config()
    seq_len = int(plan.model.seq_len)
    plan.check_matches(config, seq_len, world_size)
    if impl == "transformers":
        from uniap.runtime.hf import check_hf_plan

        check_hf_plan(plan, config)
    else:
        check_supported(config)
    plan.check_chain(layer_names(config), f"a {config.family} decoder of {config.layers} blocks")
    wl_seq = int(plan.workload.seq_len)
    if wl_seq != seq_len:
        raise UniapError(f"workload seq_len {wl_seq} differs from the model's seq_len {seq_len}")
    if config.learned_positions and seq_len > config.max_seq:
        raise UniapError(f"seq_len {seq_len} exceeds the model's {config.max_seq} learned positions")
    sizes = {len(s.ranks) for s in plan.stages}
    if len(sizes) != 1:
        raise UniapError(f"all pipeline stages must have the same number of ranks, got {sorted(sizes)}")
    stage_size = sizes.pop()
    gb = int(plan.workload.global_batch)
    c = int(plan.pipeline.micro_batches)
    if gb < 1 or gb % c:
        raise UniapError(f"global batch {gb} does not split into {c} micro-batches")
    mb = gb // c
    for layer in plan.layers:
        st = layer.strategy
        if mb % st.dp:
            raise UniapError(f"layer {layer.name}: micro-batch of {mb} samples (global batch {gb} / {c} micro-batches) "
                             f"does not split {st.dp} ways (dp)")
        if st.recompute not in RUN_RECOMPUTE:
            raise UniapError(f"layer {layer.name}: recompute {st.recompute!r} is not supported by `uniap run` "
                             f"(it runs {', '.join(RUN_RECOMPUTE)})")
        if seq_len % (2 * st.cp):
            raise UniapError(f"layer {layer.name}: context parallelism cuts seq_len {seq_len} into 2·cp = "
                             f"{2 * st.cp} equal chunks, which it does not divide into")
        if st.sp and seq_len // st.cp % st.tp:
            per_rank = f" / cp {st.cp} = {seq_len // st.cp}" if st.cp > 1 else ""
            raise UniapError(f"layer {layer.name}: sequence parallelism needs tp {st.tp} to divide seq_len "
                             f"{seq_len}{per_rank}")
        if st.tp > 1:
            if layer.name == "embed" or layer.name == "head":
                need = {"vocab": config.vocab}
            else:
                need = {"heads": config.heads, "kv_heads": config.n_kv_heads, "ffn": config.ffn}
                if config.qk_norm in ("heads", "full") and impl == "uniap":
                    raise UniapError(f"layer {layer.name}: tp {st.tp} with q/k norms over several heads "
                                     f"(qk_norm={config.qk_norm!r}) is not supported by `uniap run`")
            for what, size in need.items():
                if size % st.tp:
                    raise UniapError(f"layer {layer.name}: tp {st.tp} does not divide {what} {size}")
    precision = precision_of(str(plan.workload.precision)).name
    _check_experts(plan, config, precision)
    pp = int(plan.pipeline.degree)
    chosen = schedule_named(str(plan.pipeline.schedule))
    chosen.check(pp, c, plan.virtual_stages)
    sharded = [layer for layer in plan.layers if layer.strategy.zero >= 1]
    if chosen.split_backward and pp > 1 and sharded:
        raise UniapError(f"the {chosen.name} schedule runs ZeRO-0 layers only ({sharded[0].name} has ZeRO-"
                         f"{sharded[0].strategy.zero}): torch's weight pass runs outside the autograd hooks FSDP2 "
                         f"gathers parameters and reduce-scatters gradients in")
    schedule = chosen.runs_as(pp, c).name
    return RunShape(plan=plan, config=config, world=world_size, pp=pp, stage_size=stage_size, global_batch=gb,
                    micro_batches=c, micro_batch=mb, seq_len=seq_len, schedule=schedule,
                    virtual_stages=plan.virtual_stages, precision=precision,
                    attention=plan.engine_or(Engine()).attention)


def _check_experts(plan: Plan, config: ModelConfig, precision: str) -> None:
    """What the runtime runs of mixtures of experts (experts.py): fp32, ep over data-parallel ranks (tp 1,
    etp 1)."""
    if config.is_moe and precision != "fp32":
        raise UniapError(f"an MoE model in {precision} is not supported by `uniap run` (fp32 only)")
    for layer in plan.layers:
        st = layer.strategy
        moe = layer.name.startswith("block.") and int(layer.name.split(".")[1]) in config.moe_layers
        if not moe:
            if st.moe:
                raise UniapError(f"layer {layer.name}: ep/etp ({st.label()}) on a layer without experts")
            continue
        if st.etp > 1:
            raise UniapError(f"layer {layer.name}: expert tensor parallelism (etp {st.etp}) is not supported by "
                             f"`uniap run`")
        if st.tp > 1:
            raise UniapError(f"layer {layer.name}: tp {st.tp} on an MoE block is not supported by `uniap run` "
                             f"(its experts regroup data-parallel ranks only)")
        if st.cp > 1:
            raise UniapError(f"layer {layer.name}: cp {st.cp} on an MoE block is not supported by `uniap run` "
                             f"(its load-balancing loss and expert groups need whole sequences)")
        if config.experts % st.ep:
            raise UniapError(f"layer {layer.name}: ep {st.ep} does not divide the {config.experts} experts")
