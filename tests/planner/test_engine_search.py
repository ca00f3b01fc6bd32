"""`uniap plan --engine`: the engine-restricted optimum is never faster than the free one, equals it when the free
optimum is one the engine can run, and is always a plan `uniap export` accepts."""

import json
import random
from dataclasses import replace

import pytest

from uniap.commands.export import EngineName
from uniap.commands.options import resolve_precision
from uniap.engine_search import engine_plan_search, engine_splits
from uniap.errors import UniapError
from uniap.export import ENGINES, engine_rules, export_plan
from uniap.spec.cluster import load_cluster
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.spec.workload import Workload


def random_case(seed: int):
    """A small decoder (4–8 blocks), 1–8 A100s with memory cut to a share of the replicated training state, so that
    plans shard, recompute or pipeline."""
    rng = random.Random(seed)
    family, hidden = rng.choice(["llama", "gpt2"]), rng.choice([512, 1024, 2048])
    config = ModelConfig(name=f"random-{seed}", family=family, layers=rng.choice([4, 6, 8]), hidden=hidden,
                         heads=hidden // 128, ffn=4 * hidden, vocab=32000, max_seq=2048, gated_mlp=family == "llama",
                         norm="rmsnorm" if family == "llama" else "layernorm", bias=family != "llama",
                         learned_positions=family != "llama")
    model = build_layers(config, 2048)
    cluster = load_cluster(rng.choice(["a100-80g:1x1", "a100-80g:1x2", "a100-80g:1x4", "a100-80g:2x4"]))
    memory = cluster.device.reserve_bytes + model.parameters * 16 * rng.choice([0.3, 0.6, 1.2, 3.0])
    return model, replace(cluster, device=replace(cluster.device, memory_bytes=memory)), \
        Workload(rng.choice([8, 16, 32]), 2048, "bf16")


def restricted_against_free(seed: int) -> set[str]:
    """Check one random case for every engine; return the engines whose free optimum they can run (checked equal)."""
    model, cluster, workload = random_case(seed)
    equal = set()
    for engine in ENGINES:
        rules = engine_rules(engine)
        try:
            found = engine_plan_search(model, cluster, workload, rules, workers=1)
        except UniapError as exc:  # nothing fits at all, or nothing the engine can run fits, or not its family
            assert "no plan" in str(exc) or "cannot run" in str(exc)
            continue
        restricted, free = found.plan.predicted["iteration_time_s"], found.free.predicted["iteration_time_s"]
        assert found.free.search["optimal"] and found.plan.search["optimal"]
        assert restricted >= free * (1 - 1e-9)
        assert found.plan.predicted["fits"] and found.plan.search["engine"] == engine
        export_plan(found.plan, engine)  # what the search returns, the engine runs
        try:
            export_plan(found.free, engine)
        except UniapError:
            continue
        assert restricted == pytest.approx(free, rel=1e-9)
        equal.add(engine)
    return equal


@pytest.mark.parametrize("seed", range(6))
def test_restricted_is_never_better_than_free(seed):
    restricted_against_free(seed)


def test_restricted_equals_free_when_the_free_optimum_is_runnable():
    # cases whose free optimum is uniform and several devices wide: dp·ZeRO-2 (torchtitan, DeepSpeed), dp·ZeRO-1 and
    # tp with recompute (Megatron-LM)
    equal = set().union(*(restricted_against_free(seed) for seed in (19, 24, 33, 41)))
    assert equal == set(ENGINES)


def test_equal_on_one_device_where_every_plan_is_uniform():
    model = build_layers(ModelConfig(name="one", family="llama", layers=4, hidden=512, heads=4, ffn=1376,
                                     vocab=32000, max_seq=1024, gated_mlp=True, norm="rmsnorm", bias=False,
                                     learned_positions=False), 1024)
    cluster, workload = load_cluster("a100-80g:1x1"), Workload(8, 1024, "bf16")
    for engine in ENGINES:
        found = engine_plan_search(model, cluster, workload, engine_rules(engine), workers=1)
        assert found.slowdown == pytest.approx(0.0, abs=1e-12)


def test_engine_splits_are_what_the_engines_express():
    megatron, deepspeed = engine_rules("megatron"), engine_rules("deepspeed")
    assert engine_splits(deepspeed, 8, 2, 1) == [(4, 4)] and engine_splits(deepspeed, 7, 2, 1) == []
    two = engine_splits(megatron, 5, 2, 1)
    assert sorted(two) == [(1, 4), (2, 3), (3, 2), (4, 1)]
    four = engine_splits(megatron, 8, 4, 1)
    assert all(s[1] == s[2] and sum(s) == 8 for s in four) and (1, 3, 3, 1) in four and (2, 2, 2, 2) in four
    interleaved = engine_splits(megatron, 8, 2, 2)  # each stage's two chunks are equal
    assert sorted(interleaved) == [(1, 3, 1, 3), (2, 2, 2, 2), (3, 1, 3, 1)]
    assert all(megatron.split_why_not(s, 4) is None for s in four)
    assert all(megatron.split_why_not(s, 2) is None for s in interleaved)


def test_plan_engine_command(cli, tmp_path):
    out = tmp_path / "plan.json"
    text = cli("plan", "--model", "tiny-llama", "--cluster", "a100-80g:1x4", "--global-batch", "16",
               "--engine", "megatron", "--workers", "1", "--out", str(out)).stdout
    assert "engine-restricted plan is" in text and "slower than the free optimum" in text
    data = json.loads(out.read_text())
    assert data["search"]["engine"] == "megatron" and data["search"]["slowdown"] >= 0
    assert cli("export", str(out), "--to", "megatron").stdout.startswith("#!/bin/sh")


def test_engine_precision_is_the_fastest_the_device_and_engine_share(cli_json):
    v100 = load_cluster("v100-32g:1x2")  # fp16 125 TFLOP/s, fp32 15.7, no bf16
    assert resolve_precision(None, v100, engine_rules("torchtitan").precisions, "torchtitan") == "fp32"
    assert resolve_precision(None, v100, engine_rules("megatron").precisions, "megatron") == "fp16"
    fp16_only = replace(v100, device=replace(v100.device, peak_flops={"fp16": 125e12}))
    with pytest.raises(UniapError, match=r"computes in none of the precisions bf16, fp32 \(torchtitan's\)$"):
        resolve_precision(None, fp16_only, engine_rules("torchtitan").precisions, "torchtitan")
    plan = cli_json("plan", "-m", "tiny-llama", "-c", "v100-32g:1x1", "-b", "8", "--engine", "torchtitan",
                    "--workers", "1")
    assert plan["workload"]["precision"] == "fp32" and plan["search"]["engine"] == "torchtitan"


def test_engine_choices_are_the_exporters():
    assert [e.value for e in EngineName] == list(ENGINES)



def test_engine_search_keeps_only_strategies_whose_sequences_the_engine_splits():
    """torchtitan needs sequences of a multiple of tp·2·cp tokens: the search must not offer what export refuses."""
    import numpy as np

    from uniap.engine_search import engine_rows
    from uniap.spec import load_model
    from uniap.strategies import Strategy

    spec = load_model("tiny-llama", 68)
    strategies = [Strategy(2, 2, 3, sp=True, cp=2), Strategy(8, 1, 3)]
    allowed = np.ones((len(spec.layers), len(strategies)), bool)
    rules = engine_rules("torchtitan")
    assert len(engine_rows(spec.layers, strategies, allowed, rules, 1, 64)) == 2
    assert len(engine_rows(spec.layers, strategies, allowed, rules, 1, 68)) == 1  # 68 is no multiple of tp·2·cp = 8
