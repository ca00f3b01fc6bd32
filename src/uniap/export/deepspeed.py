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
- bf16, fp16 (mixed precision with fp32 master weights) or fp32.
The batch rule is DeepSpeed's: train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps ×
data-parallel size.
"""

from __future__ import annotations

import json

from uniap.errors import UniapError
from uniap.export.capability import EVEN, EngineJob, EngineRules
from uniap.spec.model import ModelConfig

RULES = EngineRules(name="deepspeed", families=("gpt2", "llama"), precisions=("bf16", "fp16", "fp32"),
                    zero_stages=(0, 1, 2, 3), pipeline_zero_stages=(0, 1), tensor_parallel=False,
                    sequence_parallel_always=False, replicate_alone=False, pipeline_schedules=("1f1b",), split=EVEN)

PARTITION = "type:block"
"""`PipelineModule`'s partition_method: balance the layers whose class name matches "block" (adapt the regex to
the model code's block class)."""

SCHEMA = {"train_batch_size": int, "train_micro_batch_size_per_gpu": int, "gradient_accumulation_steps": int,
          "bf16": dict, "fp16": dict, "zero_optimization": dict, "pipeline": dict, "activation_checkpointing": dict}
"""The top-level keys written and their JSON types, as DeepSpeed 0.19.8's config reads them."""


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


def write(job: EngineJob, config: ModelConfig) -> str:
    return json.dumps(config_of(job), indent=2) + "\n"


def read(text: str, world: int, blocks: int) -> dict:
    """The settings a DeepSpeed config carries for a job on `world` devices of a model with `blocks` blocks
    (DeepSpeed takes the device count from the launcher and the blocks from the model code; the split is the
    even one its balanced partition makes)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UniapError(f"not a JSON file: {exc}") from None
    for key, value in config.items():
        kind = SCHEMA.get(key)
        if kind is None or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise UniapError(f"DeepSpeed config: {key} = {value!r} is not a known {kind.__name__ if kind else 'key'}")
    try:
        pipeline = config.get("pipeline", {})
        pp = int(pipeline.get("stages", 1))
        dp = world // pp
        micro, accumulation = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
        zero = int(config.get("zero_optimization", {}).get("stage", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise UniapError(f"DeepSpeed config lacks or mis-sets {exc}") from None
    if config["train_batch_size"] != micro * accumulation * dp:
        raise UniapError("DeepSpeed config: train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step "
                         "* world_size")
    if pp > 1 and zero > 1:
        raise UniapError("DeepSpeed config: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    precision = "bf16" if config.get("bf16", {}).get("enabled") else \
        "fp16" if config.get("fp16", {}).get("enabled") else "fp32"
    recompute = pipeline.get("activation_checkpoint_interval", 0) > 0 if pp > 1 else \
        "activation_checkpointing" in config
    return {"tp": 1, "dp": dp, "pp": pp, "zero": zero, "sp": False, "recompute": recompute,
            "global_batch": config["train_batch_size"], "micro_batches": accumulation, "micro_batch_size": micro,
            "precision": precision, "schedule": "1f1b" if pp > 1 else None, "virtual_stages": 1,
            "chunk_blocks": (blocks // pp,) * pp}
