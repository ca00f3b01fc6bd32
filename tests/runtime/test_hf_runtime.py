"""Plans applied to `transformers` models as they are (`runtime/hf.py`, `uniap.parallelize`, `run --impl transformers`).

- the chain the runtime cuts a model into computes the model's own forward, exactly, for every family;
- training under mixed plans on 4 gloo ranks equals one process of the same transformers model (one launch);
- what cannot be applied is refused in one line before any process starts;
- the README's Python example runs under torchrun.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'uniap[hf]')")

import torch  # noqa: E402

from uniap.errors import UniapError  # noqa: E402
from uniap.runtime.checks import check_plan  # noqa: E402
from uniap.runtime.plans import uniform_plan  # noqa: E402
from uniap.spec.hf import read_hf_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEQ, BATCH, LR = 16, 8, 0.05
_TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4, intermediate_size=96,
             vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=0)
# A window of 5 tokens binds at 16; Gemma 2/3 soft-cap and sandwich their blocks, Gemma 3 and Qwen3 norm q/k per head.
FAMILIES = {
    "llama": {**_TINY},
    "mistral": {**_TINY, "sliding_window": 5},
    "qwen2": {**_TINY},
    "qwen3": {**_TINY, "head_dim": 32},
    "gemma": {**_TINY, "head_dim": 16},
    "gemma2": {**_TINY, "head_dim": 16, "sliding_window": 5},
    "gemma3_text": {**_TINY, "head_dim": 16, "sliding_window": 5, "sliding_window_pattern": 2},
    "phi3": {**_TINY, "sliding_window": 5},
    "olmo2": {**_TINY},
    "starcoder2": {**_TINY, "sliding_window": 5},
    "gpt_neox": {**_TINY, "rotary_pct": 0.25},
    "llama-dropout": {**_TINY, "attention_dropout": 0.1},
    "gpt2": {"n_embd": 64, "n_head": 4, "n_layer": 4, "n_positions": 64, "vocab_size": 128, "resid_pdrop": 0.0,
             "embd_pdrop": 0.0, "attn_pdrop": 0.0},  # tied embeddings, learned positions
}


def hf_config(family: str) -> dict:
    return {"model_type": family.split("-")[0], **FAMILIES[family]}


def hf_plan(family: str, **kw):
    hf = hf_config(family)
    return uniform_plan(read_hf_dict(hf, family), 4, global_batch=BATCH, seq_len=SEQ, hf_config=hf, **kw)


@pytest.mark.parametrize("family", [f for f in FAMILIES if "-" not in f])
def test_chain_computes_the_models_own_forward(family):
    """The embed / blocks / head chain (with the model-level work between layers done by the adapter) gives the
    model's own logits bit for bit, and its parameter names map back to the model's, all of them."""
    from uniap.models.decoder import DecoderSlice
    from uniap.runtime.hf import HFChain, build_hf_model

    hf = hf_config(family)
    model = build_hf_model(hf, seed=0)
    chain = HFChain(model, SEQ)
    whole = DecoderSlice(read_hf_dict(hf, family), 0, None, 0, chain.layer)
    tokens = torch.randint(0, 128, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(whole(tokens), model(input_ids=tokens).logits)
    ours = {chain.hf_name(n) for n, _ in whole.named_parameters(remove_duplicate=False)}
    assert ours == {n for n, _ in model.named_parameters(remove_duplicate=False)}


def _cases():
    """name -> plan: each family under pp2·dp2, tp2 with sp, ZeRO-3 and the interleaved schedule (GPT-2, which
    has no tensor-parallel plan in transformers, without tp), and a few mixes."""
    cases = {}
    for family in ("llama", "qwen2", "gemma2", "gemma3_text", "gpt2"):
        cases[f"{family}-pp2-dp2"] = hf_plan(family, pp=2, dp=2, micro_batches=2)
        cases[f"{family}-zero3-full"] = hf_plan(family, zero=3, recompute="full")
        cases[f"{family}-interleaved"] = hf_plan(family, pp=2, dp=2, virtual_stages=2, micro_batches=2,
                                                 schedule="interleaved-1f1b")
        if family != "gpt2":
            cases[f"{family}-tp2-sp"] = hf_plan(family, tp=2, sp=True)
    cases["llama-pp2-tp2-bf16"] = hf_plan("llama", pp=2, tp=2, micro_batches=2, precision="bf16")
    cases["llama-selective-op"] = hf_plan("llama", tp=2, recompute="selective-op")
    cases["llama-mixed"] = hf_plan("llama", zero=1, per_layer={0: {"dp": 2, "tp": 2}, 2: {"dp": 2, "tp": 2, "sp": True},
                                                              5: {"dp": 1, "tp": 4, "zero": 0}})
    cases["gemma3_text-pp2-tp2-sp"] = hf_plan("gemma3_text", pp=2, tp=2, sp=True, micro_batches=2)
    cases["gpt2-zero1-tied-pp2"] = hf_plan("gpt2", pp=2, dp=2, zero=1, micro_batches=4)
    return cases


@pytest.fixture(scope="module")
def hf_results(tmp_path_factory):
    """One 4-rank launch: every case trained 3 steps on transformers with the one-process check."""
    from uniap.runtime.job import TrainingJob
    from uniap.runtime.launch import run_many

    root = tmp_path_factory.mktemp("hf")
    names, jobs = [], []
    for name, plan in _cases().items():
        plan.save(root / f"{name}.json")
        names.append(name)
        jobs.append(TrainingJob(str(root / f"{name}.json"), steps=3, check=True, lr=LR, impl="transformers"))
    return dict(zip(names, run_many(jobs, nproc=4, timeout_s=120)))


@pytest.mark.parametrize("name", list(_cases()))
def test_plan_on_transformers_equals_one_process(hf_results, name):
    result = hf_results[name]
    check = result["check"]
    assert result["impl"] == "transformers" and result["steps"] == 3
    assert check["within_tolerance"], (name, check)
    assert result["losses"][-1] < result["losses"][0]  # it trains


@pytest.mark.parametrize("family, kw, expected", [
    ("gpt2", {"tp": 2}, "gpt2 has no base_model_tp_plan in transformers"),
    ("phi3", {"tp": 2}, "styles this runtime does not apply (mlp.down_proj: rowwise_split_input"),
    ("llama", {"recompute": "selective"}, "selective recompute of the attention core"),
    ("llama", {"cp": 2}, "context parallelism (cp 2) does not run on transformers"),
    ("llama-dropout", {"tp": 2}, "with dropout (attention_dropout 0.1) would draw different masks on the tp ranks"),
])
def test_what_cannot_be_applied_is_refused_before_launch(family, kw, expected):
    plan = hf_plan(family, **kw)
    with pytest.raises(UniapError) as err:
        check_plan(plan, 4, "transformers")
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_run_refuses_in_one_line(tmp_path):
    """`uniap run --impl transformers` on a plan it cannot apply: one line, exit 2, nothing spawned; and a family
    without an adapter is named."""
    hf_plan("gpt2", tp=2).save(tmp_path / "gpt2-tp2.json")
    bert = {"model_type": "bert", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 128}
    with pytest.raises(UniapError, match="no transformers adapter for model_type 'bert'"):
        from uniap.runtime.hf import family_of

        family_of(bert["model_type"])
    done = subprocess.run([sys.executable, "-m", "uniap.cli", "run", "--plan", str(tmp_path / "gpt2-tp2.json"),
                           "--impl", "transformers"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "base_model_tp_plan" in done.stderr, done.stderr


def test_parallelize_refuses_a_model_the_plan_is_not_for():
    from transformers import LlamaConfig, LlamaForCausalLM

    import uniap

    plan = hf_plan("llama", zero=3)
    other = LlamaForCausalLM(LlamaConfig(**{**FAMILIES["llama"], "num_hidden_layers": 2}))
    with pytest.raises(UniapError, match="plan was made for model"):
        uniap.parallelize(other, plan)
    with pytest.raises(UniapError, match="takes a transformers PreTrainedModel"):
        uniap.parallelize(torch.nn.Linear(2, 2), plan)


def test_readme_python_example_runs_under_torchrun():
    """The README's "Use it from Python" script, as it is, on 4 ranks."""
    script = ROOT / "examples" / "train_llama.py"
    assert script.read_text() in (ROOT / "README.md").read_text()  # the README shows this very script
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "4", str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [l for l in done.stdout.splitlines() if l.startswith("loss ")]
    assert line and "measured" in line[0] and "predicted" in line[0], done.stdout


def test_plan_takes_a_transformers_config_or_model_and_carries_its_config(tmp_path):
    """`uniap.plan` on a config and on a model gives the same plan, which carries the config (so that `run --impl
    transformers` builds the class), survives save/load, and refuses a bad time limit in one line."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import uniap

    config = LlamaConfig(**FAMILIES["llama"])
    by_config = uniap.plan(config, cluster="cpu:1x4", global_batch=BATCH, seq_len=SEQ)
    by_model = uniap.plan(LlamaForCausalLM(config), cluster="cpu:1x4", global_batch=BATCH, seq_len=SEQ)
    assert {**by_config.to_json(), "search": None} == {**by_model.to_json(), "search": None}
    assert by_config.model.hf_config["model_type"] == "llama"
    by_config.save(tmp_path / "plan.json")
    assert uniap.Plan.load(tmp_path / "plan.json").model.hf_config == by_config.model.hf_config
    check_plan(by_config, 4, "transformers")  # runnable on transformers as it is
    with pytest.raises(uniap.UniapError, match="time limit must be a positive number of seconds, got -1"):
        uniap.plan(config, cluster="cpu:1x4", global_batch=BATCH, seq_len=SEQ, time_limit=-1)


_UPCAST = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import uniap
from uniap.runtime.plans import uniform_plan
from uniap.spec.hf import read_hf_dict
config = LlamaConfig(**{cfg!r})
plan = uniform_plan(read_hf_dict(config.to_dict(), "llama"), 1, global_batch=2, seq_len=16, precision="bf16",
                    hf_config=config.to_dict())
model = uniap.parallelize(LlamaForCausalLM(config).to(torch.bfloat16), plan)
assert {{p.dtype for p in model.parameters()}} == {{torch.float32}}
loss = model.train_step(torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.long))
print("ok", loss)
"""


def test_parallelize_keeps_fp32_master_weights_of_a_bf16_model(tmp_path):
    """A model loaded in bf16 trains from fp32 master weights (the plan's precision casts them for compute)."""
    script = tmp_path / "upcast.py"
    script.write_text(_UPCAST.format(cfg=FAMILIES["llama"]))
    with socket.socket() as free:  # a port nobody listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]
