"""Architectures → layer chains: `build_layers(config, seq_len)` turns a ModelConfig into a ModelSpec.

Every figure is per *sample* (one sequence / one image). Notation: s tokens, h hidden, a query heads,
g key/value heads, d per-head width (a·d is the attention width, = h except GPT-3 13B / T5-3B/11B),
f FFN inner size, V vocabulary, D = 1 where the model trains with dropout.

FLOPs (forward, per sample)
    2·m·n·k per matmul. Attention scores QKᵀ and scores·V cost 2·2·s²·(a·d) per block for full attention,
    causal or not: a causal mask is *not* halved, as Megatron-LM's FLOP formula (Narayanan et al. 2021,
    eq. 3) and MFU accounting (Chowdhery et al. 2022, app. B) count it. Element-wise work (norms,
    activations, softmax, residuals) and embedding look-ups count 0. LM head: 2·s·h·V.
    A GPT block is then 24·s·h² + 4·s²·h and 3 × forward = 72·s·L·h²·(1 + s/6h + V/12hL) (Megatron).

Activations (bytes kept for backward, 16-bit, per sample; Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", §4.1). Their standard block keeps s·h·34 + 5·a·s²:
    act_other   = 10·s·h : inputs of the two norms (2·2sh), of QKV (2sh) and of fc1 (2sh), two dropout
                  masks (2·sh, 1 byte each). Replicated over tp unless sequence parallel shards them.
    act_tp      = 24·s·h : Q and K (4sh), V (2sh), attention-projection input (2sh), GeLU input (8sh) and
                  fc2 input (8sh). Sharded by tp.
    act_scores  = 5·a·s² : softmax output (2as²), its dropout mask (as²), dropout output (2as²). Sharded by
                  tp; flash attention removes them.
    act_input   = 2·s·h  : the block input, all that a fully recomputed block keeps.
Adaptations, all following the same "what does backward read" rule:
    * GQA: K and V are s·g·d wide, so they keep 2·2·s·g·d instead of 4sh.
    * No dropout (Llama; ViT and Swin as Hugging Face and Galvatron configure them, dropout 0.0): no
      masks, and the softmax output is the very tensor scores·V reads, so act_scores = 2·a·s².
    * SwiGLU (Llama): the FFN keeps gate and up projections and their product (the down-projection
      input): 3·2·s·f instead of the GeLU input and output (2·2·s·f). A fused SwiGLU keeps exactly these;
      unfused eager PyTorch also keeps silu(gate), one more 2·s·f.
    * RMSNorm keeps its input like LayerNorm (its fp32 1/rms per token, 4·s bytes, is ignored).
    * T5's FFN has a dropout between its two matrices: + s·f (mask); fc2 reads the dropout output
      instead of the activation output, so nothing else changes.
    * Swin's window attention keeps per window (w²)² scores per head: nW·a·w⁴·(2 or 5) bytes.
    * MoE blocks (`_moe_ffn`): the router input and fp32 routing probabilities per token; per routed
      token copy (s·k of them) the dispatched input, the expert's gate/up outputs and their product, and
      the expert output the combine weights. The routed part is `act_routed` / `act_routed_etp` (expert
      parallelism places it), not act_tp.
    * MLA (`_mla_attention`): the two latents (each latent norm's input and the up projection's input)
      are replicated like the QKV input; Q, K (a·dq each), V and o_proj's input (a·dv each) are sharded.

Mixture of experts: a block in `moe_layers` replaces its MLP by a router (h × E, replicated), E routed
experts of inner size fe (their weights are the block's `expert_params`: sharded by ep·etp, not by tp) and
optional shared experts (tensor-parallel like a dense MLP). A token costs its k experts' FLOPs, whatever E.
The other blocks keep the dense MLP of inner size `ffn` (DeepSeek-V3's first 3, Qwen's mlp_only_layers).
MLA (DeepSeek-V3): queries and keys/values pass through low-rank latents; see `_mla_attention`.

Tensor parallelism (Megatron, Shoeybi et al. 2019): `tp_params` are the attention/MLP matrices and the
biases of column-parallel layers (QKV, fc1); row-parallel biases, norms and relative-position tables
stay replicated. `tp_comm_elems` is what tp all-reduces in the forward pass: s·h per attention or MLP
sublayer (2·s·h per block, 3·s·h per T5 decoder block), s·h for a vocabulary-parallel embedding, and
3·s for the vocabulary-parallel cross-entropy of an LM head (max, sum of exponentials and the target
logit, one scalar per token each, Megatron `vocab_parallel_cross_entropy`). The backward pass of a
vocabulary-parallel embedding needs no all-reduce and the head's needs one of s·h (its input gradient),
so "same again in backward" is exact for blocks and, for embed + head together, over by only 3·s.
Vocabulary: padded as Megatron does (`--make-vocab-size-divisible-by` 128·tp), so vocab is NOT listed
in `tp_divides`; a tp shard holds ceil(V/tp) rows (the padding, < 128·tp rows, is not counted).

Layer names (the runtime rebuilds the torch model from them):
    gpt2, llama, bert: embed, block.0 … block.{L-1}, head
    t5:                embed, enc.0 … enc.{L-1}, dec.0 … dec.{Ld-1}, head
    vit:               embed, block.0 … block.{L-1}, head
    swin:              embed, swin.{stage}.{block} …, merge.{stage} between stages, head
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from uniap.errors import UniapError
from uniap.spec.model import LayerSpec, ModelConfig, ModelSpec
from uniap.spec.ops import Attention, Elementwise, Gemm, GroupedGemm

# Decoder-only language models: embed, blocks, head. Besides gpt2 and llama (the zoo's), the Hugging Face
# model_types spec.hf reads; they differ only in ModelConfig options (biases, norms, qk-norm, parallel
# residual, sliding windows, experts, MLA), never in code of their own.
DECODER_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "gpt_neox",
                    "falcon", "olmo2", "starcoder2", "cohere") + ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3",
                                                                  "gpt_oss")
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss")  # decoders with MoE blocks
FAMILIES = DECODER_FAMILIES + ("bert", "t5", "vit", "swin")
TEXT_FAMILIES = DECODER_FAMILIES + ("bert", "t5")
VISION_FAMILIES = ("vit", "swin")
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")
QK_NORMS = ("", "head", "heads", "full")
BLOCK_NORMS = ("pre", "post", "sandwich")

# T5 relative-attention buckets (HF T5Config.relative_attention_num_buckets default, 32 in every
# released T5 / T5 v1.1 checkpoint). The bias table (buckets × heads) lives in the first block of the
# encoder and of the decoder, as in HF `T5Block(has_relative_attention_bias=i == 0)`.
T5_BUCKETS = 32

ID_BYTES = 8  # token ids are int64


@dataclass
class _Fig:
    """Figures of one sublayer or layer, summed before they become a LayerSpec."""

    params: int = 0
    tp_params: int = 0
    flops: float = 0.0
    act_tp: float = 0.0
    act_other: float = 0.0
    act_scores: float = 0.0
    comm: int = 0
    ops: tuple = ()  # spec.ops operators of the forward pass, in order
    expert_params: int = 0  # routed experts (LayerSpec fields of the same names)
    routed_elems: int = 0
    act_routed: float = 0.0
    act_routed_etp: float = 0.0

    def __add__(self, other: "_Fig") -> "_Fig":
        return _Fig(*(getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__))


def _norm_params(cfg: ModelConfig, width: int) -> int:
    # LayerNorm: weight + bias (Cohere's: weight only); RMSNorm (Llama, T5's T5LayerNorm): weight only.
    return 2 * width if cfg.norm == "layernorm" and cfg.norm_bias else width


def _qk_norm_params(cfg: ModelConfig, q_w: int, kv_w: int, d: int) -> tuple[int, int]:
    """(parameters, of which tp shards) of the query and key norms: one d-wide weight each, shared by the
    heads and replicated under tp (Qwen3, Gemma 3), or one per head / over all heads, split with the
    heads (Cohere, OLMo 2)."""
    if cfg.qk_norm == "head":
        return 2 * _norm_params(cfg, d), 0
    if cfg.qk_norm:
        both = _norm_params(cfg, q_w) + _norm_params(cfg, kv_w)
        return both, both
    return 0, 0


def _attention(cfg: ModelConfig, s: int, h: int, heads: int, kv_heads: int, d: int, *, dropout: bool,
               causal: bool = False, windows: tuple[int, int] | None = None, window: int = 0,
               pre_norm: bool = True, post_norm: bool = False) -> _Fig:
    """Attention sublayer: norm, QKV, scores, output projection, residual dropout (pre- or post-norm
    keep the same tensors: a norm input, the QKV input, ...).

    `windows`: (number of windows, tokens per window) for Swin's window attention; None for full attention
    over the s tokens (query-key pairs per head: s², or windows × w⁴).
    `window`: a causal sliding window (Mistral, Gemma 2/3 local layers) shorter than s makes each query
    see `window` keys: s·window pairs, priced as a band (not causal-halved) by the cost model.
    `pre_norm` / `post_norm`: a norm before the sublayer and/or after it (OLMo 2, Gemma 2/3); each keeps
    its input. Attention sinks (gpt-oss): one logit per head, split with the heads under tp, no FLOPs
    counted (one more column of the softmax). T5 cross-attention has the same figures: its K and V read the encoder output (same length
    s here) instead of the norm output, and that tensor is shared by every decoder block of a stage, so it
    is not counted per block either way.
    """
    q_w, kv_w = heads * d, kv_heads * d
    queries, keys = (s, s) if windows is None else (windows[0] * windows[1], windows[1])
    if 0 < window < s:
        keys, causal = window, False
    pairs = queries * keys
    D = 1 if dropout else 0
    mats = h * q_w + 2 * h * kv_w + q_w * h
    col_bias = (q_w + 2 * kv_w) if cfg.qkv_bias else 0
    row_bias = h if cfg.out_bias else 0
    qk_params, qk_tp = _qk_norm_params(cfg, q_w, kv_w, d)
    sinks = heads if cfg.attn_sinks else 0
    norms = int(pre_norm) + int(post_norm)
    return _Fig(
        params=norms * _norm_params(cfg, h) + mats + col_bias + row_bias + qk_params + sinks,
        tp_params=mats + col_bias + qk_tp + sinks,
        flops=2.0 * s * h * (q_w + 2 * kv_w) + 2.0 * 2.0 * pairs * q_w + 2.0 * s * q_w * h,
        # Q, K, V and the output-projection input (+ Q and K before their norms)
        act_tp=2.0 * s * q_w + 2.0 * 2 * s * kv_w + 2.0 * s * q_w + (2.0 * s * (q_w + kv_w) if cfg.qk_norm else 0.0),
        # QKV input, each norm's input, residual-dropout mask (no pre-norm: QKV reads the block input)
        act_other=2.0 * s * h + 2.0 * s * h * norms + D * s * h,
        act_scores=(2 + 3 * D) * heads * float(pairs),
        comm=s * h,
        ops=((_norm_op(cfg, s * h),) if pre_norm else ()) + (Gemm(s, h, q_w + 2 * kv_w, "n"),)
        + ((_norm_op(cfg, s * (q_w + kv_w), tp_sharded=True),) if cfg.qk_norm else ())
        + ((Elementwise("rotary", s * (q_w + kv_w) * cfg.rotary_fraction, tp_sharded=True),) if _rotary(cfg) else ())
        + (Attention(heads, d, queries, keys, causal, kv_heads=kv_heads), Gemm(s, q_w, h, "k"))
        + ((_norm_op(cfg, s * h),) if post_norm else ())
        + ((Elementwise("dropout", s * h),) if dropout else ()) + (Elementwise("residual", s * h),),
    )


def _mla_attention(cfg: ModelConfig, s: int, h: int, *, dropout: bool, window: int = 0, pre_norm: bool = True,
                   post_norm: bool = False) -> _Fig:
    """Multi-head latent attention (DeepSeek-V2/V3; HF DeepseekV3Attention): a heads, rq / rkv latent widths,
    dn + dr = dq query/key width per head (dr of it rotary), dv value width per head.

    Queries: q_a_proj h → rq, RMSNorm(rq), q_b_proj rq → a·dq (or one q_proj h → a·dq when q_lora_rank is
    0). Keys and values: kv_a_proj_with_mqa h → rkv + dr (the latent and ONE rotary key shared by the
    heads), RMSNorm(rkv), kv_b_proj rkv → a·(dn + dv). Output: o_proj a·dv → h. attention_bias puts biases
    on q_a_proj, kv_a_proj_with_mqa and o_proj only.
    Tensor parallelism splits the heads: the up projections (q_b_proj / q_proj, kv_b_proj) column-parallel,
    o_proj row-parallel; the down projections and latent norms are replicated (every tp rank needs the
    whole latent).
    FLOPs: the five matmuls, then 2·pairs·a·dq for QKᵀ and 2·pairs·a·dv for scores·V.
    Kept for backward (the "what backward reads" rule): replicated, each norm's input, the down projections'
    input, the latents (each latent norm's input and the up projection's input: 2·2·s·r per latent) and the
    residual-dropout mask; tp-sharded, the attention kernel's Q and K (a·dq wide each: the shared rotary
    key is broadcast to every head), V (a·dv) and o_proj's input (a·dv).
    """
    a, rq, rkv = cfg.heads, cfg.q_lora_rank, cfg.kv_lora_rank
    dr, dn, dv = cfg.qk_rope_dim, cfg.qk_nope_dim, cfg.v_head_dim
    dq = dn + dr
    keys, causal = (window, False) if 0 < window < s else (s, True)
    pairs = s * keys
    D = 1 if dropout else 0
    q_mats = h * rq + rq * a * dq if rq else h * a * dq
    kv_mats = h * (rkv + dr) + rkv * a * (dn + dv)
    up = (rq if rq else h) * a * dq + rkv * a * (dn + dv) + a * dv * h  # what tp shards
    biases = (rq if rq else 0) + rkv + dr + h if cfg.qkv_bias else 0
    norms = int(pre_norm) + int(post_norm)
    q_ops = ((Gemm(s, h, rq), _norm_op(cfg, s * rq), Gemm(s, rq, a * dq, "n")) if rq
             else (Gemm(s, h, a * dq, "n"),))
    return _Fig(
        params=norms * _norm_params(cfg, h) + q_mats + kv_mats + a * dv * h + biases
        + (_norm_params(cfg, rq) if rq else 0) + _norm_params(cfg, rkv),
        tp_params=up,
        flops=2.0 * s * (q_mats + kv_mats + a * dv * h) + 2.0 * pairs * a * dq + 2.0 * pairs * a * dv,
        act_tp=2.0 * s * a * dq * 2 + 2.0 * s * a * dv * 2,
        act_other=2.0 * s * h * norms + 2.0 * s * h + 2.0 * 2 * s * (rq + rkv) + D * s * h,
        act_scores=(2 + 3 * D) * a * float(pairs),
        comm=s * h,
        ops=((_norm_op(cfg, s * h),) if pre_norm else ()) + q_ops
        + (Gemm(s, h, rkv + dr), _norm_op(cfg, s * rkv), Gemm(s, rkv, a * (dn + dv), "n"),
           Elementwise("rotary", s * a * dr, tp_sharded=True), Elementwise("rotary", s * dr),
           Attention(a, dq, s, keys, causal, value_dim=dv), Gemm(s, a * dv, h, "k"))
        + ((_norm_op(cfg, s * h),) if post_norm else ())
        + ((Elementwise("dropout", s * h),) if dropout else ()) + (Elementwise("residual", s * h),),
    )


def _norm_op(cfg: ModelConfig, elems: float, *, tp_sharded: bool = False) -> Elementwise:
    return Elementwise("rmsnorm" if cfg.norm == "rmsnorm" else "norm", elems, tp_sharded=tp_sharded)


def _rotary(cfg: ModelConfig) -> bool:
    """RoPE decoders (all but GPT-2) rotate queries and keys; the others add positions to the embeddings
    or, T5, a bias to the scores."""
    return cfg.family in DECODER_FAMILIES and cfg.family != "gpt2"


def _ffn(cfg: ModelConfig, s: int, h: int, f: int, *, dropout: bool, inner_dropout: bool = False,
         pre_norm: bool = True, post_norm: bool = False, shared_input: bool = False) -> _Fig:
    """Norm + MLP (two matrices, or three for a gated MLP) + residual dropout.

    `shared_input`: a parallel-residual block whose attention already keeps this sublayer's first input
    (the block input its own norm reads, or the one shared norm's output fc1 reads): 2·s·h fewer bytes.
    """
    n_in = 2 if cfg.gated_mlp else 1  # column-parallel input matrices (gate and up, or fc1)
    D = 1 if dropout else 0
    mats = (n_in + 1) * h * f
    col_bias = n_in * f if cfg.mlp_bias else 0
    row_bias = h if cfg.mlp_bias else 0
    kept = (6.0 if cfg.gated_mlp else 4.0) * s * f + (s * f if inner_dropout else 0.0)
    norms = int(pre_norm) + int(post_norm)
    return _Fig(
        params=norms * _norm_params(cfg, h) + mats + col_bias + row_bias,
        tp_params=mats + col_bias,
        flops=2.0 * s * h * f * (n_in + 1),
        act_tp=kept,
        # fc1 input, each norm's input, dropout mask
        act_other=2.0 * s * h + 2.0 * s * h * norms + D * s * h - (2.0 * s * h if shared_input else 0.0),
        comm=s * h,
        ops=((_norm_op(cfg, s * h),) if pre_norm else ()) + (Gemm(s, h, f, "n", count=n_in),
             Elementwise("swiglu" if cfg.gated_mlp else "bias_gelu", s * f, tp_sharded=True))
        + ((Elementwise("dropout", s * f, tp_sharded=True),) if inner_dropout else ())
        + (Gemm(s, f, h, "k"),) + ((_norm_op(cfg, s * h),) if post_norm else ())
        + ((Elementwise("dropout", s * h),) if dropout else ()) + (Elementwise("residual", s * h),),
    )


def _moe_ffn(cfg: ModelConfig, s: int, h: int, *, dropout: bool, pre_norm: bool = True, post_norm: bool = False,
             shared_input: bool = False) -> _Fig:
    """Norm + router + routed experts (+ shared experts) + residual dropout: an MoE block's MLP.

    Router: an h × E linear on every token, softmax (or sigmoid) and top-k in fp32; replicated under tp.
    Routed experts: each token's k experts run the family's MLP (gated or not) of inner size fe on it, so
    a token costs k experts' FLOPs whatever E is; their weights (E·(n_in+1)·h·fe) are the layer's
    `expert_params`, which ep and etp shard instead of tp. Shared experts: a dense MLP of inner size
    `shared_ffn` on every token, tensor-parallel like the dense MLP (+ Qwen2-MoE's h → 1 sigmoid gate).
    Around the experts, each token's k copies are permuted into expert order before dispatch and back after
    combine, weighted by their routing probabilities (memory-bound, over s·k·h elements each).
    Kept for backward, per routed token copy (s·k of them per sample): the dispatched expert input (2h), the
    gate and up outputs and their product (6·fe gated, 4·fe not) — split by etp — and the expert output the
    combine weights (2h). Per token: the router input (shared with the shared expert's input) and the fp32
    routing probabilities (4·E).
    """
    n_in = 2 if cfg.gated_mlp else 1
    E, k, fe, sf = cfg.experts, cfg.experts_per_token, cfg.routed_ffn, cfg.shared_ffn
    D = 1 if dropout else 0
    norms = int(pre_norm) + int(post_norm)
    experts = E * ((n_in + 1) * h * fe + ((n_in * fe + h) if cfg.expert_bias else 0))
    router = h * E + (E if cfg.router_bias else 0)
    shared = (n_in + 1) * h * sf + (h if cfg.shared_gate else 0)
    shared_ops = (Gemm(s, h, sf, "n", count=n_in),
                  Elementwise("swiglu" if cfg.gated_mlp else "bias_gelu", s * sf, tp_sharded=True),
                  Gemm(s, sf, h, "k")) + ((Gemm(s, h, 1),) if cfg.shared_gate else ()) if sf else ()
    routed = s * k
    return _Fig(
        params=norms * _norm_params(cfg, h) + router + experts + shared,
        tp_params=(n_in + 1) * h * sf,
        flops=2.0 * s * h * E + 2.0 * routed * h * fe * (n_in + 1) + 2.0 * s * h * sf * (n_in + 1)
        + (2.0 * s * h if cfg.shared_gate else 0.0),
        act_tp=(6.0 if cfg.gated_mlp else 4.0) * s * sf,
        # router input, each norm's input, fp32 routing probabilities, dropout mask
        act_other=2.0 * s * h + 2.0 * s * h * norms + 4.0 * s * E + D * s * h - (2.0 * s * h if shared_input else 0.0),
        comm=s * h,
        expert_params=experts,
        routed_elems=routed * h,
        act_routed=routed * 4.0 * h,
        act_routed_etp=routed * (6.0 if cfg.gated_mlp else 4.0) * fe,
        ops=((_norm_op(cfg, s * h),) if pre_norm else ()) + (Gemm(s, h, E),)
        + (Elementwise("permute", routed * h, tp_sharded=True), GroupedGemm(s, h, fe, E, k, "n", count=n_in),
           Elementwise("swiglu" if cfg.gated_mlp else "bias_gelu", routed * fe, tp_sharded=True),
           GroupedGemm(s, fe, h, E, k, "k"), Elementwise("unpermute", routed * h, tp_sharded=True))
        + shared_ops + ((_norm_op(cfg, s * h),) if post_norm else ())
        + ((Elementwise("dropout", s * h),) if dropout else ()) + (Elementwise("residual", s * h),),
    )


def _signature(kind: str, fig: _Fig, tokens: int, width: int, act_input: float, out_elems: int,
               divides: tuple[int, ...], experts: tuple[int, int]) -> tuple:
    return (kind, fig.params, fig.tp_params, float(fig.flops), tokens, width, float(fig.act_tp),
            float(fig.act_other), float(fig.act_scores), float(act_input), out_elems, fig.comm, divides,
            fig.expert_params, fig.routed_elems, float(fig.act_routed), float(fig.act_routed_etp), experts)


def _layer(name: str, kind: str, fig: _Fig, *, tokens: int, width: int, act_input: float, out_elems: int,
           divides: tuple[int, ...] = (), experts: tuple[int, int] = (0, 0)) -> LayerSpec:
    """`experts`: (routed experts, inner size of one) of an MoE layer; (0, 0) for a dense one."""
    return LayerSpec(
        name=name, kind=kind, params=int(fig.params), tp_params=int(fig.tp_params), flops=float(fig.flops),
        tokens=int(tokens), width=int(width), act_tp=float(fig.act_tp), act_other=float(fig.act_other),
        act_scores=float(fig.act_scores), act_input=float(act_input), out_elems=int(out_elems),
        tp_comm_elems=int(fig.comm), tp_divides=divides, experts=experts[0], expert_ffn=experts[1],
        expert_params=int(fig.expert_params), routed_elems=int(fig.routed_elems), act_routed=float(fig.act_routed),
        act_routed_etp=float(fig.act_routed_etp), ops=tuple(fig.ops),
        signature=_signature(kind, fig, tokens, width, act_input, out_elems, divides, experts),
    )


def _block_divides(heads: int, kv_heads: int, ffn: int) -> tuple[int, ...]:
    return tuple(dict.fromkeys((heads, kv_heads, ffn)))  # distinct sizes, in order


# --- validation -----------------------------------------------------------------------------------
def _fail(cfg: ModelConfig, problem: str) -> UniapError:
    return UniapError(f"model {cfg.name!r} ({cfg.family}): {problem}")


def check_config(cfg: ModelConfig) -> None:
    """Raise UniapError (one line) when the config cannot describe a model of its family."""
    if cfg.family not in FAMILIES:
        raise UniapError(f"model {cfg.name!r}: unknown family {cfg.family!r} (known: {', '.join(FAMILIES)})")
    for field_name in ("layers", "hidden", "heads", "ffn"):
        value = getattr(cfg, field_name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _fail(cfg, f"{field_name} must be a positive integer, got {value!r}")
    if cfg.kv_heads < 0 or cfg.kv_channels < 0 or cfg.decoder_layers < 0:
        raise _fail(cfg, "kv_heads, kv_channels and decoder_layers must not be negative")
    if cfg.n_kv_heads > cfg.heads or cfg.heads % cfg.n_kv_heads:
        raise _fail(cfg, f"{cfg.n_kv_heads} key/value heads must divide {cfg.heads} heads")
    if not cfg.kv_channels and cfg.hidden % cfg.heads:
        raise _fail(cfg, f"hidden {cfg.hidden} is not a multiple of {cfg.heads} heads (set kv_channels)")
    if cfg.norm not in ("layernorm", "rmsnorm"):
        raise _fail(cfg, f"norm must be 'layernorm' or 'rmsnorm', got {cfg.norm!r}")
    _check_decoder_options(cfg)
    if cfg.family in TEXT_FAMILIES:
        if cfg.vocab < 1:
            raise _fail(cfg, f"a text model needs a vocabulary, got vocab={cfg.vocab}")
        if cfg.learned_positions and cfg.max_seq < 1:
            raise _fail(cfg, f"learned positions need max_seq >= 1, got {cfg.max_seq}")
    else:
        if cfg.image_size < 1 or cfg.patch_size < 1 or cfg.image_size < cfg.patch_size:
            raise _fail(cfg, f"image_size {cfg.image_size} and patch_size {cfg.patch_size} must be positive "
                             "with patch_size <= image_size")
        if cfg.channels < 1 or cfg.num_classes < 1:
            raise _fail(cfg, f"channels and num_classes must be positive, got {cfg.channels}, {cfg.num_classes}")
    if cfg.family == "swin":
        if not cfg.depths or any(d < 1 for d in cfg.depths):
            raise _fail(cfg, f"Swin needs positive depths per stage, got {cfg.depths!r}")
        if sum(cfg.depths) != cfg.layers:
            raise _fail(cfg, f"layers {cfg.layers} != sum of depths {sum(cfg.depths)}")
        if cfg.window < 1:
            raise _fail(cfg, f"window must be positive, got {cfg.window}")


def _check_decoder_options(cfg: ModelConfig) -> None:
    """The options only decoder blocks have, each in its range."""
    if cfg.activation not in ACTIVATIONS:
        raise _fail(cfg, f"activation must be one of {', '.join(ACTIVATIONS)}, got {cfg.activation!r}")
    if cfg.qk_norm not in QK_NORMS:
        raise _fail(cfg, f"qk_norm must be one of {', '.join(repr(k) for k in QK_NORMS)}, got {cfg.qk_norm!r}")
    if cfg.block_norms not in BLOCK_NORMS:
        raise _fail(cfg, f"block_norms must be one of {', '.join(BLOCK_NORMS)}, got {cfg.block_norms!r}")
    if cfg.shared_norm and not cfg.parallel_residual:
        raise _fail(cfg, "shared_norm needs parallel_residual (one norm feeding attention and MLP side by side)")
    if cfg.parallel_residual and cfg.block_norms != "pre":
        raise _fail(cfg, f"a parallel-residual block has pre-norms only, got block_norms={cfg.block_norms!r}")
    if not 0.0 < cfg.rotary_fraction <= 1.0:
        raise _fail(cfg, f"rotary_fraction must be in (0, 1], got {cfg.rotary_fraction!r}")
    if cfg.sliding_window < 0 or cfg.attn_softcap < 0 or cfg.logit_softcap < 0:
        raise _fail(cfg, "sliding_window, attn_softcap and logit_softcap must not be negative")
    if bool(cfg.sliding_layers) != bool(cfg.sliding_window):
        raise _fail(cfg, f"sliding_window {cfg.sliding_window} and sliding_layers {list(cfg.sliding_layers)} "
                         "must be set together")
    if any(not 0 <= i < cfg.layers for i in cfg.sliding_layers):
        raise _fail(cfg, f"sliding_layers must be block indices 0..{cfg.layers - 1}, got {list(cfg.sliding_layers)}")
    _check_moe(cfg)
    _check_mla(cfg)
    decoder_only = {"qk_norm": cfg.qk_norm != "", "block_norms": cfg.block_norms != "pre",
                    "parallel_residual": cfg.parallel_residual, "sliding_window": bool(cfg.sliding_window),
                    "experts": cfg.is_moe, "kv_lora_rank": bool(cfg.kv_lora_rank), "attn_sinks": cfg.attn_sinks}
    used = [name for name, on in decoder_only.items() if on]
    if used and cfg.family not in DECODER_FAMILIES:
        raise _fail(cfg, f"{', '.join(used)} apply to decoder families only")


def _nonneg_ints(cfg: ModelConfig, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _fail(cfg, f"{name} must be a non-negative integer, got {value!r}")


def _check_moe(cfg: ModelConfig) -> None:
    """The expert fields: all zero for a dense model, consistent for an MoE one."""
    _nonneg_ints(cfg, ("experts", "experts_per_token", "expert_ffn", "shared_ffn", "mtp_layers"))
    if not cfg.is_moe:
        if cfg.experts_per_token or cfg.expert_ffn or cfg.shared_ffn or cfg.shared_gate or cfg.moe_layers \
                or cfg.router_bias or cfg.expert_bias:
            raise _fail(cfg, "expert fields (experts_per_token, expert_ffn, shared_ffn, shared_gate, moe_layers, "
                             "router_bias, expert_bias) need experts > 0")
        return
    if not 1 <= cfg.experts_per_token <= cfg.experts:
        raise _fail(cfg, f"experts_per_token must be in 1..{cfg.experts} (experts), got {cfg.experts_per_token}")
    if cfg.shared_gate and not cfg.shared_ffn:
        raise _fail(cfg, "shared_gate needs a shared expert (shared_ffn > 0)")
    if any(not isinstance(i, int) or not 0 <= i < cfg.layers for i in cfg.moe_layers):
        raise _fail(cfg, f"moe_layers must be block indices 0..{cfg.layers - 1}, got {list(cfg.moe_layers)}")


def _check_mla(cfg: ModelConfig) -> None:
    """Multi-head latent attention: the latent and per-head widths, and a head_dim equal to dn + dr."""
    _nonneg_ints(cfg, ("q_lora_rank", "kv_lora_rank", "qk_rope_dim", "qk_nope_dim", "v_head_dim"))
    if not cfg.kv_lora_rank:
        if cfg.q_lora_rank or cfg.qk_rope_dim or cfg.qk_nope_dim:
            raise _fail(cfg, "q_lora_rank, qk_rope_dim and qk_nope_dim are MLA fields: they need kv_lora_rank > 0")
        return
    if cfg.qk_rope_dim < 1 or cfg.v_head_dim < 1:
        raise _fail(cfg, f"MLA needs qk_rope_dim and v_head_dim > 0, got {cfg.qk_rope_dim}, {cfg.v_head_dim}")
    if cfg.head_dim != cfg.qk_nope_dim + cfg.qk_rope_dim:
        raise _fail(cfg, f"MLA's head_dim (kv_channels) must be qk_nope_dim + qk_rope_dim = "
                         f"{cfg.qk_nope_dim + cfg.qk_rope_dim}, got {cfg.head_dim}")
    if cfg.n_kv_heads != cfg.heads:
        raise _fail(cfg, f"MLA has no key/value head groups: kv_heads must be 0 or {cfg.heads}, got {cfg.kv_heads}")


def mtp_parameters(cfg: ModelConfig) -> int:
    """Parameters the multi-token-prediction modules add to a checkpoint that transformers does not build
    (DeepSeek-V3, `num_nextn_predict_layers`), embedding and head shared with the main model.

    Each module (DeepSeek-V3 report §2.2; the checkpoint's model.layers.61): one more decoder block like the
    last one, RMSNorms enorm and hnorm on the embedding and the hidden state (h each), eh_proj 2h → h, and
    shared_head.norm (h). DeepSeek-V3: 11.61B (the block 11.51B, the "11.5B" of its README_WEIGHTS, + eh_proj
    0.10B). The checkpoint also stores the module's own copies of the embedding and the head (V·h = 0.93B
    each): 671.03B + 11.61B + 2 × 0.93B = 684.5B, its published 685B.
    """
    if not cfg.mtp_layers:
        return 0
    h = cfg.hidden
    block = _std_block(cfg, "mtp", 1, block=cfg.layers - 1).params
    return cfg.mtp_layers * (block + 2 * h * h + 2 * _norm_params(cfg, h) + _norm_params(cfg, h))


def check_seq_len(cfg: ModelConfig, seq_len: int) -> None:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise UniapError(f"sequence length must be a positive integer, got {seq_len!r}")
    if cfg.family in TEXT_FAMILIES and cfg.learned_positions and seq_len > cfg.max_seq:
        raise UniapError(f"sequence length {seq_len} exceeds the {cfg.max_seq} learned positions of "
                         f"{cfg.name!r}")


def vision_tokens(cfg: ModelConfig) -> int:
    """Tokens per image: ViT patches + the class token; Swin: patches of the first stage."""
    side = cfg.image_size // cfg.patch_size
    return side * side + (1 if cfg.family == "vit" else 0)


# --- families ---------------------------------------------------------------------------------------
def build_layers(config: ModelConfig, seq_len: int) -> ModelSpec:
    """The layer chain of `config` at `seq_len` tokens per sample (ignored for vision: from the config)."""
    check_config(config)
    if config.family in VISION_FAMILIES:
        seq_len = vision_tokens(config)
    check_seq_len(config, seq_len)
    builder = {"bert": _bert, "t5": _t5, "vit": _vit, "swin": _swin}.get(config.family, _decoder)
    layers, tied = builder(config, seq_len)
    return ModelSpec(config=config, seq_len=seq_len, layers=tuple(layers), tied_params=tied)


def _text_embed(cfg: ModelConfig, s: int, *, streams: int = 1) -> LayerSpec:
    """Token (+ position, + token-type, + LayerNorm for BERT) embedding, vocabulary-parallel under tp.

    `streams`: T5's one shared embedding embeds the encoder and the decoder inputs (2 × s tokens).
    Keeps for backward only the token ids (the gradient of a look-up needs nothing else), BERT's
    LayerNorm input and the embedding-dropout mask.
    """
    h, D = cfg.hidden, 1 if cfg.dropout else 0
    params = cfg.vocab * h
    if cfg.learned_positions:
        params += cfg.max_seq * h  # the whole position table, whatever seq_len is used
    other = D * s * h
    ids = ID_BYTES * s
    if cfg.family == "bert":
        params += cfg.type_vocab * h + _norm_params(cfg, h)
        other += 2.0 * s * h  # embedding LayerNorm input
        ids *= 2  # token-type ids
    ops = (Elementwise("embedding", streams * s * h),) + ((Elementwise("dropout", streams * s * h),) if D else ())
    if cfg.family == "bert":
        ops += (_norm_op(cfg, s * h),)
    fig = _Fig(params=params, tp_params=cfg.vocab * h, flops=0.0, act_other=streams * other,
               comm=streams * s * h, ops=ops)
    return _layer("embed", "embedding", fig, tokens=streams * s, width=h, act_input=streams * ids,
                  out_elems=streams * s * h)


def _lm_head(cfg: ModelConfig, s: int, *, transform: bool = False, final_dropout: bool = False) -> LayerSpec:
    """Final norm (or BERT's MLM transform) + LM projection + the loss over s positions.

    The loss keeps the softmax of the logits in fp32, 4·s·V bytes (Megatron's vocab-parallel
    cross-entropy and torch autocast's cross_entropy both compute it in fp32; the 16-bit logits
    themselves are not read by backward). It is vocabulary-sharded by tp (act_tp). Note for cost.memory:
    this part does not double for fp32 training.
    """
    h, V = cfg.hidden, cfg.vocab
    fig = _Fig(params=V * h, tp_params=V * h, flops=2.0 * s * h * V, act_tp=4.0 * s * V, comm=3 * s)
    loss = (Gemm(s, h, V, "n"), Elementwise("cross_entropy", s * V, tp_sharded=True))
    if transform:
        # BERT MLM head (HF BertLMPredictionHead): dense h×h + bias, GeLU, LayerNorm, decoder (tied) +
        # its bias V (vocabulary-parallel, so sharded). The transform is replicated under tp.
        fig.params += h * h + h + _norm_params(cfg, h) + V
        fig.tp_params += V
        fig.flops += 2.0 * s * h * h
        # transform input, GeLU input, LayerNorm input, decoder input
        fig.act_other += 4 * 2.0 * s * h
        fig.ops = (Gemm(s, h, h), Elementwise("bias_gelu", s * h), _norm_op(cfg, s * h)) + loss
    else:
        fig.params += _norm_params(cfg, h)
        fig.act_other += 2.0 * s * h + 2.0 * s * h + (s * h if final_dropout else 0.0)  # norm in, lm_head in
        fig.ops = (_norm_op(cfg, s * h),) + ((Elementwise("dropout", s * h),) if final_dropout else ()) + loss
    return _layer("head", "head", fig, tokens=s, width=h, act_input=2.0 * s * h, out_elems=0)


def _std_block(cfg: ModelConfig, name: str, s: int, *, block: int = 0) -> LayerSpec:
    """A transformer block; decoders causal, with their family's options (block index `block` picks its
    attention window), BERT and ViT bidirectional and plain pre-norm."""
    h, D = cfg.hidden, cfg.dropout
    d, a, g, f = cfg.head_dim, cfg.heads, cfg.n_kv_heads, cfg.ffn
    if cfg.family not in DECODER_FAMILIES:
        fig = _attention(cfg, s, h, a, g, d, dropout=D) + _ffn(cfg, s, h, f, dropout=D)
    else:
        pre, post = cfg.block_norms in ("pre", "sandwich"), cfg.block_norms in ("post", "sandwich")
        mlp_norms = {"pre_norm": pre and not cfg.shared_norm, "post_norm": post,
                     "shared_input": cfg.parallel_residual}
        mlp = (_moe_ffn(cfg, s, h, dropout=D, **mlp_norms) if block in cfg.moe_layers
               else _ffn(cfg, s, h, f, dropout=D, **mlp_norms))
        if cfg.kv_lora_rank:
            attn = _mla_attention(cfg, s, h, dropout=D, window=cfg.window_of(block), pre_norm=pre, post_norm=post)
        else:
            attn = _attention(cfg, s, h, a, g, d, dropout=D, causal=True, window=cfg.window_of(block),
                              pre_norm=pre, post_norm=post)
        fig = attn + mlp
    if block in cfg.moe_layers:
        divides = tuple(dict.fromkeys((a, g) + ((cfg.shared_ffn,) if cfg.shared_ffn else ())))
        return _layer(name, "block", fig, tokens=s, width=h, act_input=2.0 * s * h, out_elems=s * h,
                      divides=divides, experts=(cfg.experts, cfg.routed_ffn))
    return _layer(name, "block", fig, tokens=s, width=h, act_input=2.0 * s * h, out_elems=s * h,
                  divides=_block_divides(a, g, f))


def _decoder(cfg: ModelConfig, s: int) -> tuple[list[LayerSpec], int]:
    """Decoder-only LMs (GPT-2 / GPT-3 / Megatron GPT, Llama and the Hugging Face families of
    DECODER_FAMILIES): embed, L blocks, head (final norm + LM projection).

    Tied embeddings: the head still holds the V×h matrix (its stage needs it; Megatron keeps a copy on
    the last stage and all-reduces the two gradients), and ModelSpec.tied_params = V·h counts it once.
    Blocks differ only where the config makes them differ (Gemma 2/3 alternate sliding-window and full
    layers): their signatures then differ too, so the solver folds only identical blocks.
    """
    layers = [_text_embed(cfg, s)]
    layers += [_std_block(cfg, f"block.{i}", s, block=i) for i in range(cfg.layers)]
    layers.append(_lm_head(cfg, s))
    return layers, cfg.vocab * cfg.hidden if cfg.tied_embeddings else 0


def _bert(cfg: ModelConfig, s: int) -> tuple[list[LayerSpec], int]:
    """BERT: embed (word + position + token type + LayerNorm), L post-LN encoder blocks, MLM head.

    The head is the masked-LM head (HF BertForMaskedLM: transform + decoder tied to the word
    embeddings + decoder bias), applied to all s positions as HF and Megatron do; no pooler and no
    next-sentence head (MLM-only pretraining, as RoBERTa and Megatron-BERT without binary head).
    """
    layers = [_text_embed(cfg, s)]
    layers += [_std_block(cfg, f"block.{i}", s) for i in range(cfg.layers)]
    layers.append(_lm_head(cfg, s, transform=True))
    return layers, cfg.vocab * cfg.hidden if cfg.tied_embeddings else 0


def _t5(cfg: ModelConfig, s: int) -> tuple[list[LayerSpec], int]:
    """T5: embed, encoder blocks enc.i, decoder blocks dec.i, head.

    Decoder length: the decoder runs over s tokens as well (same as the encoder; T5 pre-training uses
    512 / 114 but the planner takes one length). The shared embedding embeds both inputs, so `embed`
    and every enc.i hand on 2·s·h elements (the stream + the decoder's input embeddings riding along),
    and every dec.i hands on its stream + the encoder output (2·s·h).
    Placement of small parameters, as in HF T5: the relative-position bias table (32 buckets × heads)
    in enc.0 and dec.0; the encoder's final RMSNorm in the last encoder block; the decoder's final
    RMSNorm in the head. No biases anywhere; ReLU FFN (t5 v1.0) or gated-GeLU (v1.1, gated_mlp) with a
    dropout between the two matrices. Block 0 computes the a·s² position bias; later blocks of a stage
    reuse it (not counted: it is not a parameter, and recomputing it is element-wise).
    """
    h, a, g, d, f = cfg.hidden, cfg.heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn
    divides = _block_divides(a, g, f)
    n_dec = cfg.decoder_layers or cfg.layers
    rel = _Fig(params=T5_BUCKETS * a)
    enc_norm = _Fig(params=_norm_params(cfg, h), act_other=2.0 * s * h)
    layers = [_text_embed(cfg, s, streams=2)]
    for i in range(cfg.layers):
        fig = _attention(cfg, s, h, a, g, d, dropout=True) + _ffn(cfg, s, h, f, dropout=True, inner_dropout=True)
        if i == 0:
            fig = fig + rel
        if i == cfg.layers - 1:
            fig = fig + enc_norm
        layers.append(_layer(f"enc.{i}", "block", fig, tokens=s, width=h, act_input=2.0 * s * h,
                             out_elems=2 * s * h, divides=divides))
    for i in range(n_dec):
        fig = (_attention(cfg, s, h, a, g, d, dropout=True, causal=True)
               + _attention(cfg, s, h, a, g, d, dropout=True)  # cross-attention
               + _ffn(cfg, s, h, f, dropout=True, inner_dropout=True))
        if i == 0:
            fig = fig + rel
        layers.append(_layer(f"dec.{i}", "block", fig, tokens=s, width=h, act_input=2.0 * s * h,
                             out_elems=2 * s * h, divides=divides))
    layers.append(_lm_head(cfg, s, final_dropout=True))
    return layers, cfg.vocab * h if cfg.tied_embeddings else 0


def _vit(cfg: ModelConfig, s: int) -> tuple[list[LayerSpec], int]:
    """ViT: patch embedding, L pre-LN blocks over s = (image/patch)² + 1 tokens, head.

    embed: the patch convolution as a matmul (n patches × C·p² → h, with bias), the class token and the
    (n + 1) × h position table; replicated under tp (it is small). It keeps the image (2·C·H·W bytes)
    for the weight gradient. head: final LayerNorm over all tokens and the classifier on the class token
    (HF ViTForImageClassification); replicated under tp; keeps the LN input, the classifier input and
    the fp32 logits.
    """
    h, C, p, K = cfg.hidden, cfg.channels, cfg.patch_size, cfg.num_classes
    n = s - 1
    image = 2.0 * C * cfg.image_size * cfg.image_size
    embed = _Fig(params=C * p * p * h + h + h + s * h, flops=2.0 * n * C * p * p * h, act_other=image,
                 ops=(Gemm(n, C * p * p, h), Elementwise("residual", s * h)))
    layers = [_layer("embed", "patch_embed", embed, tokens=s, width=h, act_input=image, out_elems=s * h)]
    layers += [_std_block(cfg, f"block.{i}", s) for i in range(cfg.layers)]
    head = _Fig(params=_norm_params(cfg, h) + h * K + K, flops=2.0 * h * K,
                act_other=2.0 * s * h + 2.0 * h + 4.0 * K, ops=(_norm_op(cfg, s * h), Gemm(1, h, K)))
    layers.append(_layer("head", "head", head, tokens=s, width=h, act_input=2.0 * s * h, out_elems=0))
    return layers, 0


def swin_stages(cfg: ModelConfig) -> list[tuple[int, int, int, int]]:
    """(side, width, heads, window) of each Swin stage: the side halves (rounded up, HF pads odd sizes),
    width and heads double; the window shrinks to the side when the side is smaller (HF SwinLayer)."""
    side, out = cfg.image_size // cfg.patch_size, []
    for i in range(len(cfg.depths)):
        out.append((side, cfg.hidden << i, cfg.heads << i, min(cfg.window, side)))
        side = math.ceil(side / 2)
    return out


def _swin(cfg: ModelConfig, s: int) -> tuple[list[LayerSpec], int]:
    """Swin (Liu et al. 2021; HF SwinForImageClassification): patch embedding (+ LayerNorm), stages of
    window-attention blocks swin.{stage}.{i} at their own resolution and width, patch merging merge.{stage}
    between stages (2×2 neighbours concatenated, LayerNorm(4C), Linear 4C → 2C without bias), head
    (LayerNorm, average pool, classifier).

    Window attention: a side padded up to a multiple of the window, nW = ceil(side/w)² windows, scores
    per head nW·w⁴ (shifted windows cost the same). Each block holds its (2w−1)²·heads relative-position
    table (replicated under tp). The MLP ratio ffn/hidden of the config applies at every stage.
    Merge, embedding and head are replicated under tp.
    """
    C0, p, K = cfg.hidden, cfg.patch_size, cfg.num_classes
    ratio = cfg.ffn / cfg.hidden
    stages = swin_stages(cfg)
    n0 = stages[0][0] ** 2
    image = 2.0 * cfg.channels * cfg.image_size * cfg.image_size
    embed = _Fig(params=cfg.channels * p * p * C0 + C0 + _norm_params(cfg, C0),
                 flops=2.0 * n0 * cfg.channels * p * p * C0, act_other=image + 2.0 * n0 * C0,
                 ops=(Gemm(n0, cfg.channels * p * p, C0), _norm_op(cfg, n0 * C0)))
    if cfg.learned_positions:  # HF use_absolute_embeddings: a (patches + 1) × C table
        embed.params += (n0 + 1) * C0
    layers = [_layer("embed", "patch_embed", embed, tokens=n0, width=C0, act_input=image, out_elems=n0 * C0)]
    for st, (side, C, a, w) in enumerate(stages):
        n = side * side
        windows = math.ceil(side / w) ** 2
        f = int(round(ratio * C))
        fig = (_attention(cfg, n, C, a, a, C // a, dropout=False, windows=(windows, w * w))
               + _ffn(cfg, n, C, f, dropout=False) + _Fig(params=(2 * w - 1) ** 2 * a))
        for i in range(cfg.depths[st]):
            layers.append(_layer(f"swin.{st}.{i}", "block", fig, tokens=n, width=C, act_input=2.0 * n * C,
                                 out_elems=n * C, divides=_block_divides(a, a, f)))
        if st < len(stages) - 1:
            n_out = math.ceil(side / 2) ** 2
            merge = _Fig(params=_norm_params(cfg, 4 * C) + 4 * C * 2 * C, flops=2.0 * n_out * 4 * C * 2 * C,
                         act_other=2.0 * n_out * 4 * C * 2,  # LayerNorm input and reduction input
                         ops=(_norm_op(cfg, n_out * 4 * C), Gemm(n_out, 4 * C, 2 * C)))
            layers.append(_layer(f"merge.{st}", "merge", merge, tokens=n_out, width=2 * C,
                                 act_input=2.0 * n * C, out_elems=n_out * 2 * C))
    side, C = stages[-1][0], stages[-1][1]
    n = side * side
    head = _Fig(params=_norm_params(cfg, C) + C * K + K, flops=2.0 * C * K,
                act_other=2.0 * n * C + 2.0 * C + 4.0 * K, ops=(_norm_op(cfg, n * C), Gemm(1, C, K)))
    layers.append(_layer("head", "head", head, tokens=n, width=C, act_input=2.0 * n * C, out_elems=0))
    return layers, 0
