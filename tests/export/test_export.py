"""`uniap export`: each engine's file, read back with our schema of that engine, carries the plan's settings; plans an
engine cannot run are refused in one line naming what differs."""

import dataclasses
import json
import re
import subprocess

import pytest

from uniap.errors import UniapError
from uniap.export import export_plan
from uniap.export.capability import job_of
from uniap.strategies import Strategy

from engine_readers import read_deepspeed, read_megatron, read_torchtitan, settings_of
from export_plans import uniform_plan

S = Strategy


def read_back(engine, text, job):
    if engine == "deepspeed":
        return read_deepspeed(text, job.world, job.blocks)
    return {"torchtitan": read_torchtitan, "megatron": read_megatron}[engine](text)


CASES = [  # engine, model, strategy, chunk blocks, micro-batches, schedule, virtual stages, precision
    ("torchtitan", "tiny-llama", S(4, 1, 3), (1, 3), 4, "1f1b", 1, "bf16"),
    ("torchtitan", "tiny-llama", S(2, 2, 2, True, True), (1, 1, 1, 1), 4, "interleaved-1f1b", 2, "bf16"),
    ("torchtitan", "tiny-llama", S(8, 1, 0, True), (4,), 2, "1f1b", 1, "fp32"),
    ("torchtitan", "tiny-llama", S(2, 1, 3), (1, 1, 1, 1), 8, "gpipe", 1, "bf16"),
    ("torchtitan", "tiny-llama", S(4, 1, 3), (2, 2), 4, "zero-bubble", 1, "bf16"),
    ("torchtitan", "tiny-llama", S(2, 2, 2, False, True), (1, 1, 1, 1), 4, "zero-bubble", 2, "bf16"),
    ("megatron", "tiny-llama", S(2, 2, 1, True, True), (1, 3), 4, "1f1b", 1, "bf16"),
    ("megatron", "tiny-gpt", S(4, 2, 0), (4,), 2, "1f1b", 1, "fp16"),
    ("megatron", "tiny-llama", S(4, 1, 1), (1, 1, 1, 1), 4, "interleaved-1f1b", 2, "bf16"),
    ("megatron", "gpt2", S(2, 1, 0, True), (2, 4, 4, 2), 8, "1f1b", 1, "bf16"),
    ("megatron", "gpt2", S(1, 2, 0), (2, 1, 1, 2, 2, 1, 1, 2), 8, "interleaved-1f1b", 2, "fp32"),
    ("deepspeed", "tiny-llama", S(8, 1, 3, True), (4,), 4, "1f1b", 1, "bf16"),
    ("deepspeed", "tiny-gpt", S(4, 1, 1, True), (2, 2), 4, "1f1b", 1, "fp16"),
    ("deepspeed", "tiny-llama", S(2, 1, 0), (1, 1, 1, 1), 4, "1f1b", 1, "fp32"),
]


@pytest.mark.parametrize("engine,model,strategy,chunks,c,schedule,v,precision", CASES)
def test_export_round_trip(engine, model, strategy, chunks, c, schedule, v, precision):
    plan = uniform_plan(model, strategy=strategy, chunk_blocks=chunks, micro_batches=c, schedule=schedule,
                        virtual_stages=v, precision=precision)
    job = job_of(plan)
    settings = read_back(engine, export_plan(plan, engine), job)
    assert settings == settings_of(job)
    # and what the plan says, not only what job_of made of it
    assert (settings["tp"], settings["dp"], settings["pp"]) == (strategy.tp, strategy.dp, len(plan.stages))
    assert settings["micro_batches"] == c and settings["virtual_stages"] == v and settings["chunk_blocks"] == chunks
    assert settings["recompute"] == strategy.recompute and settings["zero"] == strategy.zero
    assert settings["micro_batch_size"] * c * strategy.dp == plan.workload.global_batch
    assert settings["schedule"] == (schedule if len(plan.stages) > 1 else None)


def test_megatron_uneven_stages_are_first_and_last_counts():
    plan = uniform_plan("gpt2", strategy=S(2, 1, 0), chunk_blocks=(2, 4, 4, 2), micro_batches=8)
    text = export_plan(plan, "megatron")
    assert "--decoder-first-pipeline-num-layers 2" in text and "--decoder-last-pipeline-num-layers 2" in text
    assert "--num-layers 12" in text and "--pipeline-model-parallel-size 4" in text
    even = export_plan(uniform_plan("gpt2", strategy=S(2, 1, 0), chunk_blocks=(3, 3, 3, 3), micro_batches=8),
                       "megatron")
    assert "first-pipeline" not in even and "last-pipeline" not in even


REFUSED = [  # engine, strategy, chunks, c, schedule, v, model, what the one line says
    ("torchtitan", S(4, 1, 1), (2, 2), 4, "1f1b", 1, "tiny-llama", "no ZeRO-1 with a pipeline"),
    ("torchtitan", S(4, 2, 0, False, True), (4,), 4, "1f1b", 1, "tiny-llama", "cannot be combined with tp, cp or pp"),
    ("torchtitan", S(4, 1, 0), (2, 2), 4, "1f1b", 1, "tiny-llama", "no ZeRO-0 with a pipeline"),
    ("torchtitan", S(4, 2, 3), (4,), 4, "1f1b", 1, "tiny-llama", "always shards the sequence"),
    ("torchtitan", S(8, 1, 3), (4,), 4, "1f1b", 1, "tiny-gpt", "no gpt2 model"),
    ("megatron", S(4, 1, 3), (2, 2), 4, "1f1b", 1, "tiny-llama", "no ZeRO-3"),
    ("megatron", S(4, 1, 1), (2, 2), 4, "gpipe", 1, "tiny-llama", "no gpipe pipeline schedule"),
    ("megatron", S(2, 1, 0), (2, 3, 5, 2), 8, "1f1b", 1, "gpt2", "the middle stages are equal"),
    ("megatron", S(4, 1, 0), (1, 1, 2, 0), 4, "interleaved-1f1b", 2, "tiny-llama",
     "stage 0 holds chunks of [1, 2] blocks"),
    ("deepspeed", S(4, 2, 1), (4,), 4, "1f1b", 1, "tiny-llama", "no tensor parallelism"),
    ("deepspeed", S(4, 1, 2), (2, 2), 4, "1f1b", 1, "tiny-llama", "no ZeRO-2 with a pipeline"),
    ("deepspeed", S(4, 1, 1), (1, 3), 4, "1f1b", 1, "tiny-llama", "splits the blocks evenly"),
    ("deepspeed", S(4, 1, 1), (1, 1, 1, 1), 4, "interleaved-1f1b", 2, "tiny-llama", "no interleaved-1f1b"),
    ("megatron", S(4, 1, 1), (2, 2), 4, "zero-bubble", 1, "tiny-llama", "no zero-bubble pipeline schedule"),
    ("deepspeed", S(4, 1, 1), (2, 2), 4, "zero-bubble", 1, "tiny-llama", "no zero-bubble pipeline schedule"),
]


@pytest.mark.parametrize("engine,strategy,chunks,c,schedule,v,model,says", REFUSED)
def test_export_refuses_what_the_engine_cannot_run(engine, strategy, chunks, c, schedule, v, model, says):
    plan = uniform_plan(model, strategy=strategy, chunk_blocks=chunks, micro_batches=c, schedule=schedule,
                        virtual_stages=v)
    with pytest.raises(UniapError, match=f"^{engine} cannot run this plan: .*{re.escape(says)}") as info:
        export_plan(plan, engine)
    assert "\n" not in str(info.value)


def test_export_names_the_layer_that_differs():
    plan = uniform_plan(strategy=S(8, 1, 3), chunk_blocks=(4,))
    layers = list(plan.layers)
    layers[3] = dataclasses.replace(layers[3], strategy=S(8, 1, 2))
    mixed = dataclasses.replace(plan, layers=layers)
    for engine in ("torchtitan", "megatron", "deepspeed"):
        with pytest.raises(UniapError, match=r"^layer 3 \(block.2\) runs dp8·z2 but block.0 runs dp8·z3"):
            export_plan(mixed, engine)
    layers = list(plan.layers)
    layers[0] = dataclasses.replace(layers[0], strategy=S(8, 1, 0))
    with pytest.raises(UniapError, match=r"^layer 0 \(embed\) runs dp8 but the blocks run dp8·z3"):
        export_plan(dataclasses.replace(plan, layers=layers), "megatron")


def test_export_refuses_other_models_and_rank_orders():
    from uniap.estimate import estimate_uniform
    from uniap.spec import load_model
    from uniap.spec.cluster import load_cluster
    from uniap.spec.workload import Workload

    bert = estimate_uniform(load_model("bert-large"), load_cluster("a100-80g:1x8"), Workload(32, 512), zero=3)
    with pytest.raises(UniapError, match=r"^megatron cannot run this plan: it has no bert model here \(families gpt2, "
                                         r"llama, mixtral, deepseek_v3\)$"):
        export_plan(bert, "megatron")
    t5 = estimate_uniform(load_model("t5-large"), load_cluster("a100-80g:1x8"), Workload(32, 512), zero=3)
    with pytest.raises(UniapError, match="^export handles chains of embedding, blocks and head; t5-large is not one$"):
        export_plan(t5, "deepspeed")
    plan = uniform_plan(strategy=S(4, 1, 1), chunk_blocks=(2, 2))
    swapped = [dataclasses.replace(plan.stages[0], ranks=plan.stages[1].ranks),
               dataclasses.replace(plan.stages[1], ranks=plan.stages[0].ranks)]
    with pytest.raises(UniapError, match=r"^stage 0 runs on ranks \[4, 5, 6, 7\]: engines place stage i on ranks 0..3"):
        export_plan(dataclasses.replace(plan, stages=swapped), "deepspeed")


def test_schemas_reject_what_the_engines_do_not_know():
    plan = uniform_plan(strategy=S(4, 1, 3), chunk_blocks=(2, 2))
    text = export_plan(plan, "torchtitan")
    with pytest.raises(UniapError, match="tensor_parallel_degrees"):
        read_torchtitan(text.replace("tensor_parallel_degree", "tensor_parallel_degrees"))
    with pytest.raises(UniapError, match="fsdp_reshard_after_forward must be one of"):
        read_torchtitan(text.replace('"always"', '"sometimes"'))
    flags = export_plan(uniform_plan(strategy=S(4, 1, 1), chunk_blocks=(2, 2)), "megatron")
    with pytest.raises(UniapError, match="--zero-stage"):
        read_megatron(flags.replace("--use-distributed-optimizer", "--zero-stage 1"))
    with pytest.raises(UniapError, match="divisible by left over stages"):
        read_megatron(flags.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 2 "
                                    "--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 3"))
    config = export_plan(uniform_plan(strategy=S(8, 1, 3), chunk_blocks=(4,)), "deepspeed")
    with pytest.raises(UniapError, match="train_batch_size is not equal"):
        read_deepspeed(config, world=4, blocks=4)
    with pytest.raises(UniapError, match="lacks or mis-sets 'train_batch_size'"):
        read_deepspeed(json.dumps({k: v for k, v in json.loads(config).items() if k != "train_batch_size"}), 8, 4)


def test_export_command(cli, tmp_path):
    good = tmp_path / "plan.json"
    uniform_plan(strategy=S(2, 2, 1, False, True), chunk_blocks=(1, 3)).save(good)
    out = tmp_path / "run.sh"
    proc = cli("export", str(good), "--to", "megatron", "--out", str(out))
    assert "written to" in proc.stderr
    assert read_megatron(out.read_text())["chunk_blocks"] == (1, 3)
    assert subprocess.run(["sh", "-n", str(out)]).returncode == 0  # a well-formed shell script
    proc = cli("export", str(good), "--to", "deepspeed", check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "deepspeed cannot run this plan: its configuration has no tensor parallelism" in proc.stderr
