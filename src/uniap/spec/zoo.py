"""Preset architectures with published figures. Each entry cites where its numbers come from.

Conventions: `ffn` is the MLP inner size; GPT-style models use 4·hidden; vocabularies are the
tokenizers' real sizes (Megatron pads them for tp at run time, see spec.families).
"""

from __future__ import annotations

from uniap.spec.model import ModelConfig


def _gpt(name: str, layers: int, hidden: int, heads: int, *, vocab: int = 50257, max_seq: int = 2048,
         kv_channels: int = 0) -> ModelConfig:
    """GPT-2/GPT-3/Megatron-GPT architecture: learned positions, LayerNorm, biases, GeLU MLP 4h, tied
    input/output embeddings (Radford et al. 2019; Brown et al. 2020 §2.1 "same model and architecture
    as GPT-2"; Megatron-LM shares them by default)."""
    return ModelConfig(name=name, family="gpt2", layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden,
                       vocab=vocab, max_seq=max_seq, tied_embeddings=True, kv_channels=kv_channels)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
           max_seq: int) -> ModelConfig:
    """Llama: RoPE (no position table), RMSNorm, no biases, SwiGLU MLP, untied embeddings."""
    return ModelConfig(name=name, family="llama", layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                       ffn=ffn, vocab=vocab, max_seq=max_seq, gated_mlp=True, norm="rmsnorm", bias=False,
                       learned_positions=False, tied_embeddings=False)


def _moe(name: str, family: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
         max_seq: int, *, experts: int, topk: int, expert_ffn: int, **fields) -> ModelConfig:
    """A Llama-style mixture of experts (RoPE, RMSNorm, no biases, SwiGLU MLP and experts, untied embeddings);
    `fields` the family's own (shared experts, MLA, q/k norms). moe_layers defaults to every block."""
    return ModelConfig(name=name, family=family, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                       ffn=ffn, vocab=vocab, max_seq=max_seq, gated_mlp=True, norm="rmsnorm", bias=False,
                       learned_positions=False, tied_embeddings=False, experts=experts, experts_per_token=topk,
                       expert_ffn=expert_ffn, **fields)


def _bert(name: str, layers: int, hidden: int, heads: int) -> ModelConfig:
    """BERT: vocab 30522 (uncased WordPiece), 512 positions, 2 token types, FFN 4h, MLM decoder tied to
    the word embeddings (Devlin et al. 2019; HF bert-large-uncased config.json)."""
    return ModelConfig(name=name, family="bert", layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden,
                       vocab=30522, max_seq=512, type_vocab=2, tied_embeddings=True)


_PRESETS: tuple[ModelConfig, ...] = (
    # --- BERT ---------------------------------------------------------------------------------------
    # BERT-Large: 24 layers, hidden 1024, 16 heads (Devlin et al. 2019, §3; HF bert-large-uncased).
    _bert("bert-large", 24, 1024, 16),
    # BERT-Huge as UniAP and Galvatron train it: 32 layers, hidden 1280, 16 heads, vocab 30522, 512
    # positions (Hetu-Galvatron galvatron/models/bert_hf/meta_configs/bert-huge-uncased-32.json; UniAP,
    # Lin et al. 2024, reports ~672M parameters).
    _bert("bert-huge", 32, 1280, 16),
    # --- T5 -----------------------------------------------------------------------------------------
    # T5-Large (Raffel et al. 2020 §3.7; HF t5-large config.json): 24 + 24 blocks, d_model 1024, d_ff 4096,
    # 16 heads × d_kv 64, vocab 32128, relative positions (n_positions 512 is the default length), ReLU
    # FFN, RMS-style LayerNorm without bias, no biases, tied embeddings (737,668,096 parameters in HF).
    # Galvatron's t5-large meta config has the same figures.
    ModelConfig(name="t5-large", family="t5", layers=24, decoder_layers=24, hidden=1024, heads=16, ffn=4096,
                vocab=32128, max_seq=512, norm="rmsnorm", bias=False, learned_positions=False,
                tied_embeddings=True),
    # --- ViT ----------------------------------------------------------------------------------------
    # ViT-Huge as Galvatron (and so UniAP) configures it: 32 layers, hidden 1280, MLP 5120, 16 heads,
    # image 224, patch 16, 1000 classes (Hetu-Galvatron galvatron/models/vit_hf/meta_configs/
    # vit-huge-patch16-224.json), ~632M parameters.
    ModelConfig(name="vit-huge", family="vit", layers=32, hidden=1280, heads=16, ffn=5120, max_seq=197,
                image_size=224, patch_size=16, channels=3, num_classes=1000),
    # ViT-H/14 of the ViT paper (Dosovitskiy et al. 2021, Table 1: 32 layers, 1280, MLP 5120, 16 heads,
    # 632M; HF google/vit-huge-patch14-224-in21k): 257 tokens at 224².
    ModelConfig(name="vit-huge-14", family="vit", layers=32, hidden=1280, heads=16, ffn=5120, max_seq=257,
                image_size=224, patch_size=14, channels=3, num_classes=1000),
    # --- Swin ---------------------------------------------------------------------------------------
    # Swin-Huge as Galvatron (and so UniAP) configures it: embed dim 320, depths (2, 2, 42, 2), heads
    # (8, 16, 32, 64), window 7, patch 4, image 224, MLP ratio 4, 1000 classes, no absolute positions
    # (Hetu-Galvatron galvatron/models/swin/meta_configs/swin-huge-patch4-window7-224.json).
    ModelConfig(name="swin-huge", family="swin", layers=48, hidden=320, heads=8, ffn=1280, max_seq=3136,
                image_size=224, patch_size=4, channels=3, num_classes=1000, depths=(2, 2, 42, 2), window=7,
                learned_positions=False),
    # --- GPT-2 (Radford et al. 2019; HF gpt2, gpt2-medium, gpt2-large, gpt2-xl config.json) --------------
    _gpt("gpt2", 12, 768, 12, max_seq=1024),
    _gpt("gpt2-medium", 24, 1024, 16, max_seq=1024),
    _gpt("gpt2-large", 36, 1280, 20, max_seq=1024),
    _gpt("gpt2-xl", 48, 1600, 25, max_seq=1024),
    # --- GPT-3 (Brown et al. 2020, Table 2.1: n_layers, d_model, n_heads, d_head; context 2048;
    # GPT-2's BPE vocabulary of 50257) -----------------------------------------------------------------
    # GPT-3 XL: Table 2.1 lists 24 heads × d_head 128, which is inconsistent with d_model 2048 (24 × 128 =
    # 3072, and would give 1.5B parameters, not 1.3B). We use 16 heads × 128 = 2048 as Megatron-LM's and
    # GPT-Neo's 1.3B configurations do.
    _gpt("gpt3-1.3b", 24, 2048, 16),
    _gpt("gpt3-2.7b", 32, 2560, 32),  # d_head 80
    _gpt("gpt3-6.7b", 32, 4096, 32),
    # GPT-3 13B: Table 2.1 gives d_model 5140 with 40 heads × d_head 128 (= 5120 attention width); taken
    # literally (kv_channels=128) it gives 12.93B, the table's 13.0B within 0.6%.
    _gpt("gpt3-13b", 40, 5140, 40, kv_channels=128),
    _gpt("gpt3-175b", 96, 12288, 96),
    # --- Megatron 1T (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
    # Clusters Using Megatron-LM", Table 1: 128 layers, hidden 25600, 160 heads, 1008B parameters; vocab
    # 51200 and sequence 2048 as in their §5.1) ----------------------------------------------------------
    _gpt("gpt-1t", 128, 25600, 160, vocab=51200),
    # --- Llama 2 (Touvron et al. 2023; HF meta-llama/Llama-2-{7,13,70}b-hf config.json): vocab 32000,
    # 4096 positions; 70B uses GQA with 8 key/value heads ---------------------------------------------
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    # --- Llama 3 / 3.1 (Llama Team 2024, "The Llama 3 Herd of Models", Table 3; HF meta-llama/
    # Meta-Llama-3-8B, -70B and Llama-3.1-405B config.json): vocab 128256, GQA 8 kv heads, pre-training
    # sequence 8192 (405B's max_position_embeddings is 131072 after long-context training; RoPE needs no
    # table, so longer sequences are accepted) ----------------------------------------------------------
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    # --- mixtures of experts (the figures of their Hugging Face config.json, as spec.hf reads them; the
    # stored copies and where they come from: tests/data/hf/<name>/SOURCE) -------------------------------
    # Mixtral 8x7B (Jiang et al. 2024; mistralai/Mixtral-8x7B-v0.1 config.json): 32 blocks, 8 experts of
    # 14336, top-2, GQA 8 kv heads, 32768 positions; 46.7B parameters, 12.9B active.
    _moe("mixtral-8x7b", "mixtral", 32, 4096, 32, 8, 14336, 32000, 32768, experts=8, topk=2, expert_ffn=14336),
    # Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json, as the Qwen3 report's Table 2 gives it): 94 blocks,
    # hidden 4096, 64 heads × 128 with 4 kv heads, q/k norms, 128 experts of 1536, top-8, no shared expert,
    # every block MoE (decoder_sparse_step 1, mlp_only_layers []), vocab 151936, 40960 positions; 235B, 22B active.
    _moe("qwen3-235b-a22b", "qwen3_moe", 94, 4096, 64, 4, 12288, 151936, 40960, experts=128, topk=8,
         expert_ffn=1536, kv_channels=128, qk_norm="head"),
    # DeepSeek-V3 (DeepSeek-AI 2024, §4.2; deepseek-ai/DeepSeek-V3 config.json): 61 blocks, hidden 7168, MLA
    # with 128 heads (q latent 1536, kv latent 512, q/k heads 128 + 64 rotary, values 128), the first 3
    # blocks dense (ffn 18432), then 256 routed experts of 2048, top-8, plus 1 shared expert; pre-trained
    # at 4096 tokens (YaRN-extended after). 671B parameters in the main model, 37B active; its 1 MTP module
    # is not in the chain (spec.families.mtp_parameters).
    _moe("deepseek-v3", "deepseek_v3", 61, 7168, 128, 0, 18432, 129280, 4096, experts=256, topk=8, expert_ffn=2048,
         shared_ffn=2048, moe_layers=tuple(range(3, 61)), kv_channels=192, q_lora_rank=1536, kv_lora_rank=512,
         qk_rope_dim=64, qk_nope_dim=128, v_head_dim=128, mtp_layers=1),
    # --- tiny models for local (CPU) runs -----------------------------------------------------------
    ModelConfig(name="tiny-gpt", family="gpt2", layers=4, hidden=128, heads=4, ffn=512, vocab=512, max_seq=64,
                tied_embeddings=False),
    ModelConfig(name="tiny-llama", family="llama", layers=4, hidden=128, heads=4, kv_heads=4, ffn=352, vocab=512,
                max_seq=64, gated_mlp=True, norm="rmsnorm", bias=False, learned_positions=False,
                tied_embeddings=False),
)

ZOO: dict[str, ModelConfig] = {cfg.name: cfg for cfg in _PRESETS}
