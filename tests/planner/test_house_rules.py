"""Small rules a user meets first: hand layouts split as evenly as they can be, a time limit is positive, and a
broken plan file says what is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from uniap.errors import UniapError
from uniap.estimate import uniform_split
from uniap.plans import Plan
from uniap.spec import load_model

UNIAP = Path(sys.executable).with_name("uniap")


@pytest.mark.parametrize("name, pp, v", [("llama3-405b", 16, 7), ("llama3-405b", 16, 1), ("gpt3-175b", 8, 5),
                                         ("llama2-70b", 4, 7), ("llama2-70b", 4, 3)])
def test_uniform_split_balances_blocks_per_stage_then_per_chunk(name, pp, v):
    model = load_model(name, 2048)
    chunk_of = uniform_split(model, pp, v)
    blocks = np.array([layer.kind not in ("embedding", "head") for layer in model.layers])
    per_chunk = np.bincount(chunk_of[blocks], minlength=pp * v)
    per_stage = np.bincount(np.arange(pp * v) % pp, weights=per_chunk, minlength=pp)
    assert per_stage.max() - per_stage.min() <= 1  # 405B on pp16·v7: 7 or 8 blocks a stage, not 14 on two of them
    for s in range(pp):
        mine = per_chunk[s::pp]
        assert mine.max() - mine.min() <= 1 and mine.min() >= 1
    assert (np.diff(chunk_of) >= 0).all()  # chunks are contiguous and in chain order


def test_uniform_split_keeps_megatrons_split_when_layers_divide():
    model = load_model("llama2-70b", 2048)  # 80 blocks over pp4·v5 = 20 chunks of 4
    chunk_of = uniform_split(model, 4, 5)
    assert np.bincount(chunk_of)[1:-1].tolist() == [4] * 18


@pytest.mark.parametrize("limit", ["-1", "0"])
@pytest.mark.parametrize("command", ["plan -m tiny-gpt -c cpu:1x4 -b 8", "compare -m tiny-gpt -c cpu:1x4 -b 8",
                                     "demo --out-dir {tmp}/demo"])
def test_a_time_limit_that_is_not_positive_is_refused_first(limit, command, tmp_path):
    """`compare` and `demo` search after other work (the baselines, the profile): they refuse it before any."""
    args = command.format(tmp=tmp_path).split() + ["--time-limit", limit]
    done = subprocess.run([str(UNIAP), *args], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == f"uniap: error: the time limit must be a positive number of seconds, got {float(limit)}"
    assert done.stdout == "" and not (tmp_path / "demo").exists()


def test_a_plan_without_its_last_layer_names_what_is_missing(tmp_path):
    done = subprocess.run([str(UNIAP), "estimate", "-m", "tiny-gpt", "-c", "cpu:1x4", "-b", "8", "--format", "json"],
                          capture_output=True, text=True, check=True)
    data = json.loads(done.stdout)
    data["layers"] = data["layers"][:-1]
    with pytest.raises(UniapError) as err:
        Plan.from_json(data).validate()
    layers = len(data["layers"])
    assert str(err.value) == f"the plan lists {layers} layers but its model has {layers + 1} (missing: {layers})"


def test_a_plan_edited_to_a_shorter_chain_counts_both_chains(tmp_path):
    """The model section edited along with the layers passes the plan's own checks; costing and running it count
    the plan's layers and the model's."""
    from uniap.runtime.checks import check_plan

    done = subprocess.run([str(UNIAP), "estimate", "-m", "tiny-gpt", "-c", "cpu:1x4", "-b", "8", "--pp", "2",
                           "--format", "json"], capture_output=True, text=True, check=True)
    data = json.loads(done.stdout)
    data["layers"] = data["layers"][:-1]
    data["model"]["layers"] -= 1
    data["stages"][-1]["layers"][1] -= 1
    data["stages"][-1]["chunks"][-1][1] -= 1
    (tmp_path / "plan.json").write_text(json.dumps(data))
    estimated = subprocess.run([str(UNIAP), "estimate", "--plan", str(tmp_path / "plan.json")], capture_output=True,
                               text=True)
    assert estimated.returncode == 2
    assert estimated.stderr.strip() == ("uniap: error: the plan lists 5 layers (embed, block.0, …, block.3) but "
                                        "model tiny-gpt has 6 (embed, block.0, …, head)")
    with pytest.raises(UniapError, match=r"^the plan lists 5 layers \(embed, block.0, …, block.3\) but a gpt2 "
                                         r"decoder of 4 blocks has 6 \(embed, block.0, …, head\)$"):
        check_plan(Plan.from_json(data), 4)


def test_plan_sections_are_typed_frozen_and_refuse_unknown_fields():
    import dataclasses

    done = subprocess.run([str(UNIAP), "estimate", "-m", "tiny-gpt", "-c", "cpu:1x4", "-b", "8", "--pp", "2",
                           "--format", "json"], capture_output=True, text=True, check=True)
    data = json.loads(done.stdout)
    plan = Plan.from_json(data)
    assert (plan.pipeline.degree, plan.workload.global_batch, plan.cluster.devices) == (2, 8, 4)
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()  # the JSON round-trips
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.pipeline.degree = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.predicted = {}
    data["pipeline"]["micro_batch"] = 2  # a typo of micro_batches
    with pytest.raises(UniapError, match=r"unknown pipeline field\(s\) \['micro_batch'\]"):
        Plan.from_json(data)
