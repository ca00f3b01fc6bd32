"""The runtime tests' models, tolerances and the plans of the 4-rank equality launch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from uniap.plans import StagePlan
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy as S

try:  # the zoo defines the tiny models identically
    from uniap.spec.zoo import ZOO

    GPT = ZOO["tiny-gpt"]
    LLAMA = ZOO["tiny-llama"]
except (ImportError, KeyError):  # pragma: no cover - before the zoo landed
    GPT = ModelConfig(name="tiny-gpt", family="gpt2", layers=4, hidden=128, heads=4, ffn=512, vocab=512, max_seq=64,
                      tied_embeddings=False)
    LLAMA = ModelConfig(name="tiny-llama", family="llama", layers=4, hidden=128, heads=4, kv_heads=4, ffn=352,
                        vocab=512, max_seq=64, gated_mlp=True, norm="rmsnorm", bias=False, learned_positions=False,
                        tied_embeddings=False)
GQA = dataclasses.replace(LLAMA, name="tiny-llama-gqa", kv_heads=2)
GPT6 = dataclasses.replace(GPT, name="tiny-gpt-6", layers=6)  # 8 layers: room for pp4 × 2 chunks
TIED = dataclasses.replace(GPT, name="tiny-gpt-tied", tied_embeddings=True)
HF_GPT2 = Path(__file__).resolve().parent.parent / "data" / "hf" / "gpt2" / "config.json"
# GPT-2's own config.json (tie_word_embeddings defaults to true), shrunk so that a run takes a second: 2 blocks,
# hidden 64, 64 positions, and a vocabulary that tp can split (the runtime does not pad 50257 as Megatron does).
GPT2_SHRINK = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "n_ctx": 64, "vocab_size": 512}

DATA = Path(__file__).resolve().parents[1] / "data" / "hf"
FAMILY_LAYERS, FAMILY_SEQ, FAMILY_WINDOW = 6, 16, 5


def tiny_family(folder: str) -> ModelConfig:
    """A Hugging Face decoder family's options (tests/data/hf/<folder>) on 6 blocks of width 64: 4 heads
    (MQA/GQA/MHA and a head_dim apart from hidden/heads kept), a window of 5 tokens on the blocks the real
    model slides on, untied embeddings, no soft-capping."""
    from uniap.spec import read_hf_config

    cfg = read_hf_config(DATA / folder / "config.json")
    kv = {1: 1, cfg.heads: 4}.get(cfg.n_kv_heads, 2)
    return dataclasses.replace(
        cfg, layers=FAMILY_LAYERS, hidden=64, heads=4, kv_heads=kv, ffn=96, vocab=128, max_seq=FAMILY_SEQ,
        kv_channels=32 if cfg.kv_channels else 0, tied_embeddings=False, attn_softcap=0.0, logit_softcap=0.0,
        sliding_window=FAMILY_WINDOW if cfg.sliding_layers else 0,
        sliding_layers=tuple(i for i in cfg.sliding_layers if i < FAMILY_LAYERS))


TOL = 1e-5
STANDARD = {"kernels": "eager", "attention": "standard"}  # the engine of the cpu preset: SDPA's math path
LR = 0.05  # SGD: large enough that a wrong gradient visibly moves the parameters


def equality_plans():
    """name -> (plan, job options) for the 4-rank equality launch."""
    from uniap.runtime.plans import uniform_plan

    interleaved = uniform_plan(GPT, 4, pp=2, tp=2, micro_batches=4, schedule="1f1b",
                               per_layer={"block.2": S(2, 1, 0), "block.3": S(2, 1, 3, recompute=True)})
    interleaved = dataclasses.replace(interleaved, stages=[StagePlan(0, (0, 2), interleaved.stages[0].layers),
                                                           StagePlan(1, (1, 3), interleaved.stages[1].layers)])
    return {
        "gpt-dp4": (uniform_plan(GPT, 4, dp=4), {}),
        "gpt-dp4-zero3-mb2": (uniform_plan(GPT, 4, dp=4, zero=3, micro_batches=2), {}),
        "llama-dp4-zero1": (uniform_plan(LLAMA, 4, dp=4, zero=1), {}),
        "gpt-tp4": (uniform_plan(GPT, 4, tp=4), {}),
        "gpt-pp2-tp2-1f1b": (uniform_plan(GPT, 4, pp=2, tp=2, micro_batches=2, schedule="1f1b"), {}),
        # stage 0: embed dp2·z3 -> block tp2 -> block dp2; stage 1: block dp2·z2·rc -> block tp2sp -> head tp2
        "gpt-pp2-mixed-gpipe": (uniform_plan(GPT, 4, pp=2, tp=2, micro_batches=2, schedule="gpipe", per_layer={
            "embed": S(2, 1, 3), "block.1": S(2, 1, 0), "block.2": S(2, 1, 2, recompute=True),
            "block.3": S(1, 2, sp=True)}), {}),
        "llama-pp4-gpipe": (uniform_plan(LLAMA, 4, pp=4, micro_batches=4, schedule="gpipe"), {}),
        "gpt-pp4-1f1b-uneven": (uniform_plan(GPT, 4, pp=4, micro_batches=4, schedule="1f1b",
                                             stage_layers=[1, 3, 1, 1]), {}),
        "llama-dp2tp2-zero3-recompute": (uniform_plan(LLAMA, 4, dp=2, tp=2, zero=3, recompute=True,
                                                      micro_batches=2), {}),
        # one stage, a different strategy on every layer: tp4 -> tp4sp -> dp2tp2sp -> dp4·z3 -> dp2tp2·z2·rc -> tp4
        "llama-mixed-one-stage": (uniform_plan(LLAMA, 4, tp=4, per_layer={
            "embed": S(4, 1, 1), "block.0": S(1, 4, sp=True), "block.1": S(2, 2, 0, sp=True), "block.2": S(4, 1, 3),
            "block.3": S(2, 2, 2, recompute=True), "head": S(1, 4)}), {}),
        # stages on interleaved ranks (0,2) and (1,3); tp2 at the end of stage 0, dp2 at the start of stage 1
        "gpt-pp2-interleaved-ranks": (interleaved, {}),
        # interleaved 1F1B: chunk j on stage j mod P
        "gpt-pp2-v2": (uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=2, schedule="interleaved-1f1b",
                                    virtual_stages=2), {}),
        "gpt6-pp4-v2": (uniform_plan(GPT6, 4, pp=4, micro_batches=4, schedule="interleaved-1f1b",
                                     virtual_stages=2), {}),
        "llama-pp2-v2-tp2": (uniform_plan(LLAMA, 4, pp=2, tp=2, micro_batches=2, schedule="interleaved-1f1b",
                                          virtual_stages=2), {}),
        "gpt-pp2-v2-dp2-zero3-uneven": (uniform_plan(GPT, 4, pp=2, dp=2, zero=3, micro_batches=4,
                                                     schedule="interleaved-1f1b", virtual_stages=2,
                                                     stage_layers=[1, 3, 1, 1]), {}),
        # zero bubble (torch's ScheduleInterleavedZeroBubble): the backward split into input and weight passes
        "gpt-pp2-zb-dp2": (uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=2, schedule="zero-bubble"), {}),
        "gpt6-pp4-zb-v2": (uniform_plan(GPT6, 4, pp=4, micro_batches=4, schedule="zero-bubble", virtual_stages=2),
                           {}),
        "llama-pp2-zb-v2-tp2": (uniform_plan(LLAMA, 4, pp=2, tp=2, micro_batches=2, schedule="zero-bubble",
                                             virtual_stages=2), {}),
        "gpt-pp2-zb-dp2-recompute": (uniform_plan(GPT, 4, pp=2, dp=2, recompute=True, micro_batches=4,
                                                  schedule="zero-bubble"), {}),
        # the V schedules (torch's ScheduleZBVZeroBubble, ScheduleDualPipeV): stage i runs chunks i and 2P − 1 − i,
        # so stage 0 holds both ends of the chain (a tied embedding's two copies on one rank)
        "gpt-pp2-zbv-dp2": (uniform_plan(GPT, 4, pp=2, dp=2, micro_batches=4, schedule="zero-bubble-v",
                                         virtual_stages=2), {}),
        "gpt6-pp4-zbv": (uniform_plan(GPT6, 4, pp=4, micro_batches=8, schedule="zero-bubble-v", virtual_stages=2), {}),
        "tied-pp2-dualpipev-tp2": (uniform_plan(TIED, 4, pp=2, tp=2, micro_batches=4, schedule="dualpipe-v",
                                                virtual_stages=2), {}),
        # sequence parallelism: sequence slices cross a stage boundary and are re-laid out to/from row blocks
        "gpt-pp2-tp2sp-relayout": (uniform_plan(GPT, 4, pp=2, tp=2, sp=True, micro_batches=2,
                                                per_layer={"block.2": S(2, 1, 0)}), {}),
        "llama-tp4sp-recompute": (uniform_plan(LLAMA, 4, tp=4, sp=True, recompute=True), {}),
        # mixed precision (tolerances: runtime/precision.py): every wrapper kind in bf16; fp16 with loss scaling
        # on one-rank stages (single-rank meshes) with tied embeddings across the pipeline
        "bf16-gpt-pp2-mixed": (uniform_plan(GPT, 4, pp=2, tp=2, micro_batches=2, schedule="gpipe", precision="bf16",
                                            per_layer={"embed": S(2, 1, 3), "block.1": S(2, 1, 0),
                                                       "block.2": S(2, 1, 2, recompute=True),
                                                       "block.3": S(1, 2, sp=True)}), {}),
        "fp16-tied-pp4": (uniform_plan(TIED, 4, pp=4, micro_batches=4, precision="fp16"), {}),
        # tied embeddings: both copies on one stage, laid out differently (gathered, summed, re-sharded) ...
        "tied-tp4-embed-dp4-zero3": (uniform_plan(TIED, 4, tp=4, per_layer={"embed": S(4, 1, 3)}), {}),
        # ... on the first and last stage with the same layout (shards all-reduced over the pair groups) ...
        "tied-pp2-tp2": (uniform_plan(TIED, 4, pp=2, tp=2, micro_batches=2), {}),
        # ... and on different stages laid out differently (full gradients all-reduced over the pair groups)
        "tied-pp2-embed-dp2-zero3-head-tp2": (uniform_plan(TIED, 4, pp=2, tp=2, micro_batches=2,
                                                           per_layer={"embed": S(2, 1, 3)}), {}),
        # selective recompute (the attention core) beside tp and ZeRO-3, in both attention kernels
        "llama-dp2tp2-zero3-selective": (uniform_plan(LLAMA, 4, dp=2, tp=2, zero=3, recompute="selective",
                                                      micro_batches=2), {}),
        "gpt-dp4-selective-standard": (uniform_plan(GPT, 4, dp=4, recompute="selective", engine=STANDARD), {}),
        # context parallelism: load-balanced chunks, keys and values all-gathered, causal mask by global position
        "llama-cp4": (uniform_plan(LLAMA, 4, cp=4), {}),
        "gpt-cp2-dp2-zero3": (uniform_plan(GPT, 4, dp=2, cp=2, zero=3, micro_batches=2), {}),  # learned positions
        "llama-cp2-tp2": (uniform_plan(LLAMA, 4, tp=2, cp=2), {}),
        "llama-cp2-tp2sp-selective": (uniform_plan(LLAMA, 4, tp=2, cp=2, sp=True, recompute="selective"), {}),
        "gpt-pp2-cp2-1f1b": (uniform_plan(GPT, 4, pp=2, cp=2, micro_batches=2), {}),
        # cp differs between the layers of one stage: re-laid out between them
        "llama-mixed-cp": (uniform_plan(LLAMA, 4, dp=4, per_layer={
            "block.0": S(1, 1, cp=4), "block.1": S(2, 1, 0, recompute="selective", cp=2),
            "block.2": S(1, 2, sp=True, cp=2), "head": S(1, 4)}), {}),
        # tied copies sharded over the same 4 replicas: dp4 (embedding) and dp2·cp2 (head)
        "tied-embed-dp4-rest-dp2cp2": (uniform_plan(TIED, 4, dp=2, cp=2, zero=2, per_layer={"embed": S(4, 1, 2)}),
                                       {}),
    }


def memory_plans():
    """name -> plan of the memory launch (2 steps, AdamW: the cost model's optimizer)."""
    from uniap.models.decoder import as_trained
    from uniap.runtime.plans import uniform_plan

    plain_ends = {"embed": S(1, 4), "head": S(1, 4)}  # only the blocks differ between tp and tp·sp
    gpt = as_trained(GPT)  # priced as the decoder runs it: without GPT-2's dropout
    return {"mem-llama-tp4": uniform_plan(LLAMA, 4, tp=4, per_layer=plain_ends),
            "mem-llama-tp4sp": uniform_plan(LLAMA, 4, tp=4, sp=True, per_layer=plain_ends),
            "mem-gpt-tp4": uniform_plan(gpt, 4, tp=4, per_layer=plain_ends),
            "mem-gpt-tp4sp": uniform_plan(gpt, 4, tp=4, sp=True, per_layer=plain_ends),
            "mem-llama-dp4-fp32": uniform_plan(LLAMA, 4, dp=4),
            "mem-llama-dp4-bf16": uniform_plan(LLAMA, 4, dp=4, precision="bf16")}


def planned_gpt2(root: Path) -> Path:
    """`uniap plan` of the shrunk GPT-2 config.json on 4 CPU ranks in bf16 (CPU's default is fp32: the run
    then also exercises mixed precision); returns the plan's path."""
    config = {**json.loads(HF_GPT2.read_text()), **GPT2_SHRINK}
    (root / "gpt2").mkdir(exist_ok=True)
    (root / "gpt2" / "config.json").write_text(json.dumps(config))
    out = root / "gpt2-plan.json"
    subprocess.run([sys.executable, "-m", "uniap.cli", "plan", "--model", str(root / "gpt2" / "config.json"),
                    "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len", "32", "--precision", "bf16", "--out", str(out),
                    "--format", "json"], check=True, capture_output=True, timeout=120)
    return out


def context_plans():
    """name -> 2-rank plan of context parallelism and selective recompute (the 2-rank launch checks each against
    one process): rotary and learned positions, grouped-query attention, Gemma 3's sliding windows and q/k norms,
    bf16, selective recompute under each attention kernel, and torchtitan's op policy under tp with sp."""
    from uniap.runtime.plans import uniform_plan

    gemma = tiny_family("gemma-3-4b")
    return {"llama-cp2": uniform_plan(LLAMA, 2, cp=2),
            "gpt-cp2-selective": uniform_plan(GPT, 2, cp=2, recompute="selective"),
            "gqa-cp2-standard": uniform_plan(GQA, 2, cp=2, engine=STANDARD),
            "gemma3-cp2-selective-standard": uniform_plan(gemma, 2, cp=2, micro_batches=2, seq_len=FAMILY_SEQ,
                                                          recompute="selective", engine=STANDARD),
            "llama-dp2-selective": uniform_plan(LLAMA, 2, dp=2, recompute="selective", micro_batches=2),
            "llama-tp2sp-selective-op": uniform_plan(LLAMA, 2, tp=2, sp=True, recompute="selective-op"),
            "bf16-llama-cp2": uniform_plan(LLAMA, 2, cp=2, precision="bf16")}


def family_plans():
    """name -> 2-rank plan of a tiny decoder family (the 2-rank launch checks each against one process):
    Gemma 3's head-wide q/k norms (their gradient summed over tp), sandwich norms and sliding windows under
    tp2, with and without sequence parallelism. The other families' options are tp-local (biases, norms of replicated tensors) or need no
    distributed code; each job costs ~6 s here, so one covers them."""
    from uniap.runtime.plans import uniform_plan

    gemma = tiny_family("gemma-3-4b")
    return {"gemma3-tp2": uniform_plan(gemma, 2, tp=2, micro_batches=2, seq_len=FAMILY_SEQ),
            # sandwich norms on sequence slices: their gradients must be summed over tp too
            "gemma3-tp2sp": uniform_plan(gemma, 2, tp=2, sp=True, micro_batches=2, seq_len=FAMILY_SEQ)}
