"""DeepSpeed: a config JSON (`deepspeed.initialize(..., config=FILE)`).

Checked against DeepSpeed 0.19.8 (PyPI; `deepspeed/runtime/config.py`, `runtime/pipe/engine.py`,
`runtime/pipe/module.py`), whose `DeepSpeedConfig` parses what `write` produces (tests/export/
test_engine_parsers.py). What it can express:
- ZeRO stages 0–3 without a pipeline; its PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with
  pipeline parallelism", so 0–1 with one;
- no tensor parallelism of its own (Megatron-DeepSpeed brings it through an mpu; not exported);
- the pipeline engine's TrainSchedule is 1F1B with `gradient_accumulation_steps` micro-batches, no virtual
  stages; `PipelineModule(num_stages=P, partition_method="type:<block class>")` balances the blocks, which
  is an even split when P divides them (embedding on the first stage, head on the last) — that is the only
  split exported. The stage count and partition live in the model code; the config's `pipeline` section
  records them, and its `activation_checkpoint_interval` (1: every layer) recomputes;
- without a pipeline, recomputation is the model's own (`deepspeed.checkpointing`, configured by the
  `activation_checkpointing` section written when the plan recomputes). Either way a whole layer is recomputed:
  the config has no selective (attention-core) recomputation (`runtime/activation_checkpointing/config.py` has
  partition_activations, cpu_checkpointing, contiguous_memory_optimization, number_checkpoints,
  synchronize_checkpoint_boundary and profile only), so a selective or selective-op plan is refused;
- no context parallelism: its sequence parallelism (Ulysses: `deepspeed.sequence.layer.DistributedAttention`,
  the config's `sequence_parallel_size` only sizing the data-parallel world in `DeepSpeedConfig`) is an all-to-all
  over attention heads set up in the model code, not the plan's load-balanced split of the sequence with keys and
  values passed around; a plan with cp > 1 is refused;
- bf16, fp16 (mixed precision with fp32 master weights) or fp32; no fp8 (the config has no fp8 section: fp8
  GEMMs would be the model code's, Transformer Engine's `fp8_autocast`), so an fp8 plan is refused;
- any model family: the model is the user's own code (`architecture_why_not`), but not a mixture of experts,
  whose experts DeepSpeed places inside that code (`deepspeed.moe.layer.MoE(ep_size=...)`), not from the config.
The batch rule is DeepSpeed's: train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps ×
data-parallel size.
"""

from __future__ import annotations

import json

from uniap.schedules import exported_schedules
from uniap.export.capability import EVEN, EngineJob, EngineRules
from uniap.spec.model import ModelConfig


def architecture_why_not(config: ModelConfig) -> str | None:
    """A mixture of experts: its expert layout is the model code's (deepspeed.moe.layer.MoE), which a config cannot
    set. Otherwise nothing: DeepSpeed wraps the user's own model code, which builds the architecture as planned."""
    if config.is_moe:
        return "its experts and their ep are set in the model code (deepspeed.moe.layer.MoE), not in its config"
    return None


RULES = EngineRules(name="deepspeed", families=None, precisions=("bf16", "fp16", "fp32"),
                    recompute_levels=("none", "full"), context_parallel=False,
                    zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1), tensor_parallel=False,
                    sequence_parallel_always=False, replicate_alone=False, pipeline_schedules=tuple(exported_schedules("deepspeed")), split=EVEN,
                    architecture_why_not=architecture_why_not,
                    absent={"fp8": "its config has no fp8 section (fp8 GEMMs would be the model code's, e.g. Transformer "
                                   "Engine's fp8_autocast)",
                            "selective": "its activation checkpointing recomputes whole layers (the pipeline's "
                                         "activation_checkpoint_interval, deepspeed.checkpointing), never the "
                                         "attention core alone",
                            "selective-op": "its activation checkpointing recomputes whole layers (the pipeline's "
                                            "activation_checkpoint_interval, deepspeed.checkpointing), never per op",
                            "cp": "its sequence parallelism (Ulysses, sequence_parallel_size) is an all-to-all over "
                                  "attention heads in the model code, not a split of the sequence"})

PARTITION = "type:block"
"""`PipelineModule`'s partition_method: balance the layers whose class name matches "block" (adapt the regex to
the model code's block class)."""

def config_of(job: EngineJob) -> dict:
    config = {"train_batch_size": job.global_batch, "train_micro_batch_size_per_gpu": job.micro_batch_size,
              "gradient_accumulation_steps": job.micro_batches}
    if job.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif job.precision == "fp16":
        config["fp16"] = {"enabled": True}
    config["zero_optimization"] = {"stage": job.zero if job.dp > 1 else 0}
    recompute = job.recompute == "full"  # the one level RULES lets through besides none
    if job.pp > 1:
        config["pipeline"] = {"stages": job.pp, "partition": PARTITION,
                              "activation_checkpoint_interval": int(recompute)}
    elif recompute:
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    return config


def write(job: EngineJob) -> str:
    return json.dumps(config_of(job), indent=2) + "\n"
