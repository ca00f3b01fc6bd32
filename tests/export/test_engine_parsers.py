"""The exported files read by the engines' own config code, where it installs (a test-only extra, checked with
torchtitan 0.2.2 and 0.3.0 (one at a time: the tests pick by version) and DeepSpeed 0.19.8 in a private venv);
skipped when they are missing. test_export.py checks the same files against our schemas always."""

import shlex

import pytest

from uniap.export import export_plan
from uniap.export.capability import job_of
from uniap.strategies import Strategy as S

from export_plans import uniform_plan


def torchtitan_manager(line: str):
    """torchtitan's ConfigManager of the release `line` ("0.2", "0.3"), or skip."""
    torchtitan = pytest.importorskip("torchtitan")
    if not torchtitan.__version__.startswith(line):
        pytest.skip(f"torchtitan {torchtitan.__version__} installed, this checks {line}.x")
    return pytest.importorskip("torchtitan.config.manager")


INTERLEAVED_TP = dict(strategy=S(2, 2, 2, True, True), chunk_blocks=(1, 1, 1, 1), micro_batches=4,
                      schedule="interleaved-1f1b", virtual_stages=2)


def test_torchtitan_0_2_config_manager_reads_the_toml(tmp_path):
    manager = torchtitan_manager("0.2")
    plan = uniform_plan(**INTERLEAVED_TP)
    path = tmp_path / "job.toml"
    path.write_text(export_plan(plan, "torchtitan"))
    config = manager.ConfigManager().parse_args(["--job.config_file", str(path)])
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.data_parallel_shard_degree) == (2, 2, 2)
    assert par.data_parallel_replicate_degree == 1 and par.fsdp_reshard_after_forward == "never"
    assert par.pipeline_parallel_schedule == "Interleaved1F1B" and par.pipeline_parallel_microbatch_size == 4
    assert par.module_fqns_per_model_part == [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"],
                                              ["layers.3", "norm", "output"]]
    assert config.training.local_batch_size == 16 and config.training.global_batch_size == 32
    assert config.activation_checkpoint.mode == "full" and config.training.mixed_precision_param == "bfloat16"


def test_torchtitan_0_3_config_manager_reads_the_header_command_line():
    manager = torchtitan_manager("0.3")
    text = export_plan(uniform_plan(**INTERLEAVED_TP), "torchtitan")
    line = next(line for line in text.splitlines() if line.startswith("#   torchtitan 0.3.0:"))
    words = shlex.split(line)
    args = words[words.index("--config") + 2:]  # after the recipe: the plan's overrides
    config = manager.ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *args])
    par = config.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.data_parallel_shard_degree) == (2, 2, 2)
    assert par.fsdp_reshard_after_forward == "never" and par.pipeline_parallel_schedule == "Interleaved1F1B"
    assert par.module_fqns_per_model_part == [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"],
                                              ["layers.3", "norm", "output"]]
    assert (config.training.local_batch_size, config.training.global_batch_size) == (16, 32)
    assert type(config.activation_checkpoint).__qualname__ == "FullAC.Config"


class DataParallel:
    """The one thing DeepSpeedConfig asks of an mpu: the data-parallel world size."""

    def __init__(self, size):
        self.size = size

    def get_data_parallel_world_size(self):
        return self.size


@pytest.mark.parametrize("strategy,chunks,precision", [(S(8, 1, 3, True), (4,), "bf16"),
                                                     (S(4, 1, 1, True), (2, 2), "bf16"),
                                                     (S(2, 1, 0), (1, 1, 1, 1), "fp16")])
def test_deepspeed_config_parser_reads_the_json(strategy, chunks, precision, monkeypatch):
    config_mod = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(config_mod.dist, "get_rank", lambda: 0)  # no process group here; the mpu gives the size
    utils = pytest.importorskip("deepspeed.runtime.utils")
    import json

    plan = uniform_plan(strategy=strategy, chunk_blocks=chunks, micro_batches=4, precision=precision)
    job = job_of(plan)
    text = export_plan(plan, "deepspeed")
    config = config_mod.DeepSpeedConfig(json.loads(text), mpu=DataParallel(job.dp))
    assert config.train_batch_size == 32 and config.gradient_accumulation_steps == 4
    assert config.train_micro_batch_size_per_gpu == 32 // (4 * job.dp)
    assert config.zero_optimization_stage == strategy.zero
    assert (config.bfloat16_config.enabled, config.float16_config.enabled) == (precision == "bf16", precision == "fp16")
    if job.pp > 1:
        assert config.pipeline["stages"] == job.pp
        assert config.pipeline["activation_checkpoint_interval"] == int(strategy.recompute)
        # PipelineModule's "type:" partition balances the blocks: our even split, embedding first, head last
        bounds = [int(b) for b in utils.partition_balanced([0] + [1] * job.blocks + [0], job.pp)]
        assert [sum(1 <= u <= job.blocks for u in range(a, b)) for a, b in zip(bounds, bounds[1:])] == list(chunks)
