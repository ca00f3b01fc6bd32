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
  `activation_checkpointing` section written when the plan recomputes);
- bf16, fp16 (mixed precision with fp32 master weights) or fp32;
- any model family: the model is the user's own code (`architecture_why_not`), but not a mixture of experts,
  whose experts DeepSpeed places inside that code (`deepspeed.moe.layer.MoE(ep_size=...)`), not from the config.
The batch rule is DeepSpeed's: train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps ×
data-parallel size.
"""

from __future__ import annotations

import json

from uniap.export.capability import EVEN, EngineJob, EngineRules
from uniap.spec.model import ModelConfig


def architecture_why_not(config: ModelConfig) -> str | None:
    """A mixture of experts: its expert layout is the model code's (deepspeed.moe.layer.MoE), which a config cannot
    set. Otherwise nothing: DeepSpeed wraps the user's own model code, which builds the architecture as planned."""
    if config.is_moe:
        return "its experts and their ep are set in the model code (deepspeed.moe.layer.MoE), not in its config"
    return None


RULES = EngineRules(name="deepspeed", families=None, precisions=("bf16", "fp16", "fp32"),
                    zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1), tensor_parallel=False,
                    sequence_parallel_always=False, replicate_alone=False, pipeline_schedules=("1f1b",), split=EVEN,
                    architecture_why_not=architecture_why_not)

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
    if job.pp > 1:
        config["pipeline"] = {"stages": job.pp, "partition": PARTITION,
                              "activation_checkpoint_interval": int(job.recompute)}
    elif job.recompute:
        config["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False}
    return config


def write(job: EngineJob) -> str:
    return json.dumps(config_of(job), indent=2) + "\n"
