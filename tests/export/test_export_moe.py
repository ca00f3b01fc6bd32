"""Expert-parallel plans exported: Megatron-LM's MoE flags and folding rules, torchtitan's expert_parallel_degree
and the layouts its mesh can borrow, DeepSpeed's refusal; and the engine search kept to the layouts each runs."""

import dataclasses
import re
import tomllib

import numpy as np
import pytest

from uniap.engine_search import engine_rows
from uniap.errors import UniapError
from uniap.estimate import make_plan
from uniap.export import engine_rules, export_plan
from uniap.export.torchtitan import flavor_of
from uniap.spec.cluster import load_cluster
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.spec.workload import Workload
from uniap.spec.zoo import ZOO
from uniap.strategies import Strategy as S, enumerate_strategies

from engine_readers import megatron_arguments, read_megatron, read_torchtitan, torchtitan_0_3_command

MIXTRAL = dataclasses.replace(ZOO["tiny-llama"], name="tiny-mixtral", experts=8, experts_per_token=2)
QWEN3_MOE = dataclasses.replace(ZOO["tiny-llama"], name="tiny-qwen3-moe", family="qwen3", kv_channels=32,
                                qk_norm="head", experts=8, experts_per_token=2, expert_ffn=64)


def moe_plan(config: ModelConfig, moe: S, chunk_blocks=(4,), micro_batches=4, schedule="1f1b", cluster="a100-80g:1x8"):
    """`moe` on the MoE blocks, it without ep/etp on the dense ones and without recompute on embedding and head."""
    spec = build_layers(config, config.max_seq)
    dense = dataclasses.replace(moe, ep=1, etp=1)
    strategies = list(dict.fromkeys([moe, dense, dataclasses.replace(dense, recompute=False)]))
    kinds = [2] + [0 if layer.experts else 1 for layer in spec.layers[1:-1]] + [2]
    strategy_of = np.array([strategies.index((moe, dense, strategies[-1])[k]) for k in kinds])
    stage_of = np.array([0] + [j for j, n in enumerate(chunk_blocks) for _ in range(n)] + [len(chunk_blocks) - 1])
    return make_plan(spec, load_cluster(cluster), Workload(32, spec.seq_len, "bf16"), schedule, micro_batches,
                     strategies, stage_of, strategy_of, predicted={})


def test_megatron_writes_experts_and_their_folding():
    plan = moe_plan(MIXTRAL, S(4, 2, 1, True, True, ep=4, etp=1))
    text = export_plan(plan, "megatron")
    world, args = megatron_arguments(text)
    read_megatron(text)  # Megatron's own rules: ep divides the experts, etp·ep·pp the world, sp with tp
    assert (args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size) == (8, 2, 352)
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (4, 1)
    assert args.moe_token_dispatcher_type == "alltoall" and args.moe_grouped_gemm and args.sequence_parallel
    assert args.moe_layer_freq == 1 and args.moe_shared_expert_intermediate_size is None


def test_megatron_writes_the_dense_moe_pattern_and_shared_experts():
    config = dataclasses.replace(MIXTRAL, moe_layers=(1, 3), shared_ffn=256, shared_gate=True, expert_ffn=64)
    plan = moe_plan(config, S(8, 1, 1, ep=8))
    _, args = megatron_arguments(text := export_plan(plan, "megatron"))
    read_megatron(text)
    assert args.moe_layer_freq == [0, 1, 0, 1] and args.moe_ffn_hidden_size == 64 and args.ffn_hidden_size == 352
    assert args.moe_shared_expert_intermediate_size == 256 and args.moe_shared_expert_gate
    assert args.expert_model_parallel_size == 8 and not args.moe_grouped_gemm  # one expert per rank


def test_megatron_writes_latent_attention():
    config = dataclasses.replace(MIXTRAL, kv_lora_rank=64, q_lora_rank=96, qk_rope_dim=16, qk_nope_dim=32,
                                 v_head_dim=32, kv_channels=48)
    _, args = megatron_arguments(export_plan(moe_plan(config, S(8, 1, 1, ep=2)), "megatron"))
    assert args.multi_latent_attention and (args.kv_lora_rank, args.q_lora_rank) == (64, 96)
    assert (args.qk_head_dim, args.qk_pos_emb_head_dim, args.v_head_dim) == (32, 16, 32)


@pytest.mark.parametrize("engine,strategy,why", [
    ("megatron", S(4, 2, 1, ep=2), "its MoE layers with tensor parallelism need sequence parallelism"),
    ("megatron", S(8, 1, 1, ep=8, etp=1), None),
    ("torchtitan", S(4, 2, 3, True, True), "its experts without expert parallelism are split like the MLP, etp = tp"),
    ("torchtitan", S(2, 4, 3, False, True, ep=2, etp=2), "its expert parallelism keeps each expert whole, etp 1"),
    ("torchtitan", S(8, 1, 0, ep=2), "its expert parallelism borrows ranks from FSDP and tp"),
    ("deepspeed", S(8, 1, 1), "its experts and their ep are set in the model code (deepspeed.moe.layer.MoE)"),
])
def test_what_an_engine_cannot_lay_out_is_refused_in_one_line(engine, strategy, why):
    config = QWEN3_MOE if engine == "torchtitan" else MIXTRAL
    plan = moe_plan(config, strategy)
    if why is None:
        assert export_plan(plan, engine)
        return
    with pytest.raises(UniapError, match="^" + re.escape(f"{engine} cannot run this plan: {why}")) as caught:
        export_plan(plan, engine)
    assert "\n" not in str(caught.value)


def test_engines_refuse_a_plan_that_lays_out_moe_blocks_differently():
    plan = moe_plan(MIXTRAL, S(8, 1, 1, ep=4))
    layers = list(plan.layers)
    layers[2] = dataclasses.replace(layers[2], strategy=S(8, 1, 1, ep=2))
    with pytest.raises(UniapError, match=r"^layer 2 \(block.1\) runs dp8·z1·ep2 but the first MoE block runs "
                                         r"dp8·z1·ep4: engines run one strategy over all MoE blocks$"):
        export_plan(dataclasses.replace(plan, layers=layers), "megatron")
    dense = moe_plan(dataclasses.replace(MIXTRAL, moe_layers=(0, 1)), S(8, 1, 1, ep=4))
    layers = list(dense.layers)
    layers[3] = dataclasses.replace(layers[3], strategy=S(8, 1, 1, ep=4))
    with pytest.raises(UniapError, match=r"^layer 3 \(block.2\) runs dp8·z1·ep4 but the MoE blocks run dp8·z1·ep4: "
                                         r"engines give a dense block that strategy without expert parallelism"):
        export_plan(dataclasses.replace(dense, layers=layers), "megatron")


def test_torchtitan_writes_ep_borrowed_from_fsdp_and_tp():
    plan = moe_plan(QWEN3_MOE, S(4, 2, 3, False, True, ep=8), chunk_blocks=(2, 2), schedule="1f1b",
                    cluster="a100-80g:2x8")
    text = export_plan(plan, "torchtitan")
    read_torchtitan(text)
    par = tomllib.loads(text)["parallelism"]
    assert par["expert_parallel_degree"] == 8 and par["data_parallel_shard_degree"] == 4
    assert par["tensor_parallel_degree"] == 2 and "expert_tensor_parallel_degree" not in par
    _, _, overrides = torchtitan_0_3_command(text)
    assert overrides[overrides.index("--parallelism.expert_parallel_degree") + 1] == "8"


def test_torchtitan_names_its_moe_flavor():
    config = dataclasses.replace(QWEN3_MOE, name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, ffn=6144,
                                 vocab=151936, kv_heads=4, kv_channels=128, experts=128, experts_per_token=8,
                                 expert_ffn=768, moe_layers=())
    assert flavor_of(config).name == "30B-A3B"
    assert flavor_of(dataclasses.replace(config, experts_per_token=4)) is None


def test_torchtitan_refuses_moe_it_has_no_model_for():
    for config, why in ((MIXTRAL, "its llama3 has no mixture of experts"),
                        (dataclasses.replace(QWEN3_MOE, moe_layers=(1, 3)), "its qwen3 MoE makes every block MoE"),
                        (dataclasses.replace(QWEN3_MOE, shared_ffn=64), "its qwen3 MoE has no shared expert")):
        with pytest.raises(UniapError, match=rf"^torchtitan cannot run this plan: {why}"):
            export_plan(moe_plan(config, S(8, 1, 3, ep=2)), "torchtitan")


def layouts(engine: str, config: ModelConfig, devices=8, pp=1) -> set[tuple]:
    """The MoE-block strategies (dp, tp, zero, sp, ep, etp) of the engine search's rows for a stage of `devices`."""
    spec = build_layers(config, config.max_seq)
    strategies = enumerate_strategies(devices, recompute=False, experts=config.experts,
                                      expert_layouts=[(ep, etp) for ep in (1, 2, 4, 8) for etp in (1, 2)
                                                      if devices % (ep * etp) == 0])
    rows = engine_rows(spec.layers, strategies, np.ones((len(spec.layers), len(strategies)), bool),
                       engine_rules(engine), pp)
    moe = next((u for u, layer in enumerate(spec.layers) if layer.experts), 1)
    picked = {strategies[k] for k in rows[:, moe]}
    for row in rows:  # dense blocks and the edges never carry an expert layout
        assert not any(strategies[k].moe for u, k in enumerate(row) if not spec.layers[u].experts)
    return {(s.dp, s.tp, s.zero, s.sp, s.ep, s.etp) for s in picked}


def test_engine_search_keeps_only_the_expert_layouts_the_engine_runs():
    megatron = layouts("megatron", dataclasses.replace(MIXTRAL, moe_layers=(1, 3)))
    assert (2, 4, 1, True, 4, 2) in megatron and (8, 1, 0, False, 8, 1) in megatron
    assert not any(tp > 1 and not sp for _, tp, _, sp, _, _ in megatron)
    titan = layouts("torchtitan", QWEN3_MOE)
    assert titan and all(etp == (tp if ep == 1 else 1) for _, tp, _, _, ep, etp in titan)
    assert all(ep == 1 or (dp if zero >= 2 else 1) * tp % ep == 0 for dp, tp, zero, _, ep, _ in titan)
    assert (4, 2, 3, True, 8, 1) in titan and (8, 1, 3, False, 8, 1) in titan and (8, 1, 0, False, 2, 1) not in titan
    dense = ZOO["tiny-llama"]  # a dense model: every strategy Megatron has, none with an expert layout
    assert layouts("megatron", dense) == {(s.dp, s.tp, s.zero, s.sp, 1, 1)
                                          for s in enumerate_strategies(8, recompute=False) if s.zero < 2}
