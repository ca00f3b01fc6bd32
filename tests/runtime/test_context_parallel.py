"""Context parallelism and selective recompute in the runtime: the load-balanced cut of a sequence, 2-rank runs
equal to one process (4-rank ones: test_runtime_equality.py), what is refused before a process starts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime_cases import GPT, LLAMA, context_plans
from uniap.errors import UniapError
from uniap.runtime.checks import check_plan
from uniap.runtime.context_parallel import local_positions
from uniap.runtime.plans import uniform_plan
from uniap.runtime.precision import precision_of
from uniap.runtime.relayout import Layout, local_part


@pytest.mark.parametrize("cp", [2, 4])
def test_each_rank_holds_an_early_and_a_late_chunk_and_together_they_cover_the_sequence(cp):
    t = 32
    parts = [local_positions(t // cp, r, cp) for r in range(cp)]
    assert sorted(torch.cat(parts).tolist()) == list(range(t))
    chunk = t // (2 * cp)
    for r, pos in enumerate(parts):
        assert pos.tolist() == list(range(r * chunk, (r + 1) * chunk)) + \
            list(range((2 * cp - 1 - r) * chunk, (2 * cp - r) * chunk))
    # every rank's queries see the same number of causal keys: the point of the cut
    assert len({int((p[:, None] + 1).sum()) for p in parts}) == 1


def test_local_part_cuts_rows_then_cp_chunks_then_sp_slices():
    full = torch.arange(4 * 16).reshape(4, 16)  # (rows, sequence)
    layout = Layout(dp=2, tp=2, seq=True, cp=2)  # position p: tp p % 2, cp (p // 2) % 2, dp p // 4
    assert layout.shape(4, 16) == (2, 4)
    part = local_part(full, layout, 7)  # dp block 1, cp rank 1 (chunks 1 and 2 of 4), tp slice 1
    assert torch.equal(part, full[2:4, 8:12])
    part = local_part(full, layout, 2)  # dp block 0, cp rank 1, tp slice 0: chunk 1
    assert torch.equal(part, full[0:2, 4:8])


@pytest.mark.parametrize("name", list(context_plans()))
def test_context_parallel_and_selective_recompute_match_one_process(two_rank_results, name):
    check = two_rank_results[name]["check"]
    tol = precision_of(context_plans()[name].workload.precision).check_tolerance  # fp32: 1e-5
    assert check["max_rel_loss_diff"] <= tol.loss and check["max_rel_param_diff"] <= tol.params, check


def _refused(plan, match: str) -> None:
    with pytest.raises(UniapError, match=match) as err:
        check_plan(plan, plan.world_size)
    assert "\n" not in str(err.value)


def test_a_sequence_that_does_not_cut_into_2cp_chunks_is_refused():
    _refused(uniform_plan(LLAMA, 4, cp=4, seq_len=36), r"2·cp = 8 equal chunks")


def test_sp_slices_of_a_cp_part_must_be_whole():
    _refused(uniform_plan(LLAMA, 8, cp=2, tp=4, sp=True, seq_len=12), r"tp 4 to divide seq_len 12 / cp 2 = 6")


def test_cp_on_an_moe_block_is_refused():
    from test_moe_runtime import MOE, SEQ

    _refused(uniform_plan(MOE, 2, cp=2, seq_len=SEQ), r"cp 2 on an MoE block is not supported by `uniap run`")


def test_fp8_is_refused_before_anything_is_launched(tmp_path, cli):
    plan = uniform_plan(GPT, 4, dp=4)
    plan = dataclasses.replace(plan, workload=dataclasses.replace(plan.workload, precision="fp8"))
    path = tmp_path / "fp8.json"
    plan.save(path)
    proc = cli("run", "--plan", str(path), "--nproc", "4", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "fp8 is not supported by `uniap run`" in lines[0], proc.stderr
    assert "torchrun" not in proc.stderr
