"""Decoder-only transformers (GPT-2, Llama and the Hugging Face dense decoder families) as a chain of
separately placeable layers.

The chain matches the planner's: index 0 is `embed`, 1..L are `block.0` .. `block.{L-1}`, L+1 is `head`
(final norm + LM projection; the loss is computed outside, see `lm_loss`). Every layer is its own
module so the runtime can shard, replicate or recompute each one on its own.

`DecoderSlice(config, first, last, seed)` holds layers `first..last` of the chain under the same
attribute names whatever the slice (`embed`, `blocks.<i>`, `head`), so parameter names are identical
in the one-process model, in every pipeline stage and in every checkpoint.

Tied embeddings (`tied_embeddings`): the one-process model (`build_model`) shares one Parameter between
`embed.tok` and `head.lm`. A slice holding the head gets its own copy initialised equal to the embedding
(the runtime keeps the copies equal by summing their gradients, see `runtime/tied.py`), so each layer can
still be sharded on its own and sit on its own stage.

Initialisation is deterministic per layer: layer `u` draws from a generator seeded with `(seed, u)`,
so any process can build any subset of layers and get the same numbers.

Attention is written so tensor parallelism can split it: separate q/k/v projections (column-split by
heads) and an output projection (row-split); head counts are read from the local tensor shapes, and
attention runs on local (per-rank) tensors with `F.scaled_dot_product_attention`. Its core (`Attention.core`:
scores, softmax, ·V) is one function, so that selective recompute can checkpoint just it and context
parallelism can gather keys and values inside it. The kernel is the plan's engine's (`use_attention_kernel`):
flash (SDPA's fused kernel: on CPU `_scaled_dot_product_flash_attention_for_cpu`, which keeps no score matrix)
or standard (SDPA's math path, which keeps softmax(QKᵀ) for backward, as the cost model charges it).

The families differ only in ModelConfig options, each an option of the one block here: q/k/v, output and
MLP biases; LayerNorm with or without bias, or RMSNorm; the MLP activation, gated or not; q/k norms (per
head, per-head weights, over all heads); norms before and/or after each sublayer; parallel residual with
one or two norms; partial rotary; sliding-window layers; mixture-of-experts MLPs (`MoE`: top-k routing,
routed and shared experts, the load-balancing loss) on the blocks `moe_layers` names. What it cannot run
(attention or logit soft-capping, multi-head latent attention, multi-token prediction) is refused in one line
naming the feature. It has no dropout (`as_trained`).

What it keeps for backward is what the cost model charges (`spec/families.py`, Korthikanti et al. 2022): RMSNorm
keeps its input (and 1/rms per row), a gated MLP its gate and up projections (not act(gate)), and attention's
output is the output projection's input (one tensor). Plain eager PyTorch keeps one more tensor for each on CPU
(x/rms, act(gate), the attention output re-laid out), and act(gate) on any device; on CUDA, the fused
`torch.rms_norm` keeps what `RMSNorm` here does.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import nullcontext
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from uniap.errors import UniapError
from uniap.spec.families import DECODER_FAMILIES as FAMILIES
from uniap.spec.model import ModelConfig

INIT_STD = 0.02
_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
                "relu": F.relu}


def as_trained(config: ModelConfig) -> ModelConfig:
    """`config` as this decoder trains it, for pricing what a run holds: the decoder has no dropout layers, so a
    config that trains with dropout (GPT-2's family default, `spec.model.DROPOUT_FAMILIES`) runs without it."""
    return dataclasses.replace(config, dropout=False)


def layer_names(config: ModelConfig) -> list[str]:
    """The plan's layer chain for a decoder: embed, block.0 .. block.{L-1}, head."""
    return ["embed"] + [f"block.{i}" for i in range(config.layers)] + ["head"]


def check_supported(config: ModelConfig) -> None:
    if config.family not in FAMILIES:
        raise UniapError(f"the runtime trains decoder families {FAMILIES}, not {config.family!r}")
    if config.vocab < 1:
        raise UniapError("a decoder needs vocab > 0")
    if config.hidden % config.heads:
        raise UniapError(f"hidden {config.hidden} is not divisible by heads {config.heads}")
    if config.heads % config.n_kv_heads:
        raise UniapError(f"heads {config.heads} not divisible by kv_heads {config.n_kv_heads}")
    unsupported = {"attention logit soft-capping": config.attn_softcap, "final logit soft-capping":
                   config.logit_softcap, "multi-head latent attention": config.kv_lora_rank,
                   "multi-token prediction": config.mtp_layers, "attention sinks": config.attn_sinks}
    for feature, used in unsupported.items():
        if used:
            raise UniapError(f"{feature} ({config.name}) is not supported by `uniap run`")
    if config.is_moe and not 1 <= config.experts_per_token <= config.experts:
        raise UniapError(f"{config.name}: experts_per_token {config.experts_per_token} must be in 1..{config.experts}")


# What torchtitan's op policy keeps (its `_save_list`): matmul outputs (every second one recomputed), attention
# kernels' outputs, reduce-scatter outputs; everything else is recomputed in backward.
_AT = torch.ops.aten
_OP_POLICY_SAVES = {_AT.mm.default, _AT.addmm.default, _AT.bmm.default,
                    _AT._scaled_dot_product_flash_attention_for_cpu.default,
                    _AT._scaled_dot_product_flash_attention.default,
                    _AT._scaled_dot_product_efficient_attention.default,
                    torch.ops._c10d_functional.reduce_scatter_tensor.default}
_MATMULS = {_AT.mm.default, _AT.addmm.default, _AT.bmm.default}


def _op_policy_contexts():
    """Selective checkpointing contexts of torchtitan's op policy ("selective-op"): a fresh matmul count for the
    forward and for the recomputation, so both keep the same (odd-numbered) matmuls."""
    counts = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        if func in _MATMULS:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in _OP_POLICY_SAVES else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Layer(nn.Module):
    """A chain layer. `recompute=True` wraps its computation in activation checkpointing; `recompute_ops=True` in
    torchtitan's op policy (it keeps what `_OP_POLICY_SAVES` names, half of the matmuls' outputs among them).

    The checkpoint sits inside `forward`, so hooks a data-parallel wrapper puts around the module
    (parameter gathering) run outside the recomputed region, as with a checkpoint wrapper.
    """

    recompute: bool = False
    recompute_ops: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        if self.recompute_ops and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False, context_fn=_op_policy_contexts)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a plain tensor as it is), outside autograd: inside an autograd Function, or
    to read or update a tensor's storage."""
    return t._local_tensor if isinstance(t, DTensor) else t


class _RMSNormFunction(torch.autograd.Function):
    """x·r·w with r = 1/√(mean(x²) + eps) over the last dimension, in fp32. Keeps x and r (one fp32 number per
    row) for backward, as CUDA's fused `torch.rms_norm` does; its composite path (CPU) would also keep x·r, one
    more tensor of x's size. Under sequence parallelism x is a sequence-sharded DTensor and w a replicated one
    (`SequenceParallel`): it computes on the local slice and sums the weight gradient over the slices."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        local = local_tensor(x)
        r = torch.rsqrt(local.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, r)
        y = (local.float() * r * local_tensor(weight).float()).to(local.dtype)
        return DTensor.from_local(y, x.device_mesh, x.placements, run_check=False) if isinstance(x, DTensor) else y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, r = ctx.saved_tensors
        if isinstance(x, DTensor):
            grad = grad.redistribute(x.device_mesh, x.placements)
        local, w = local_tensor(x), local_tensor(weight)
        normed, g = local.float() * r, local_tensor(grad).float()
        grad_w = (g * normed).reshape(-1, normed.shape[-1]).sum(0).to(w.dtype)
        g = g * w.float()
        grad_x = (r * (g - normed * (g * normed).mean(-1, keepdim=True))).to(local.dtype)
        if isinstance(x, DTensor):
            grad_x = DTensor.from_local(grad_x, x.device_mesh, x.placements, run_check=False)
            grad_w = DTensor.from_local(grad_w, weight.device_mesh, (Partial(),), run_check=False).redistribute(
                weight.device_mesh, weight.placements)
        return grad_x, grad_w, None


class RMSNorm(nn.RMSNorm):
    """`nn.RMSNorm` that keeps only its input (and 1/rms per row) for backward, whatever the device."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight, self.eps)


def _norm(config: ModelConfig, width: int | None = None) -> nn.Module:
    width = config.hidden if width is None else width
    if config.norm == "rmsnorm":
        return RMSNorm(width, eps=1e-5)
    return nn.LayerNorm(width, eps=1e-5, bias=config.norm_bias)


class HeadwiseNorm(nn.Module):
    """Cohere's q/k norm: each head normalised over its width, with its own weight (heads × head_dim), on
    (B, T, heads, head_dim)."""

    def __init__(self, config: ModelConfig, heads: int):
        super().__init__()
        self.rms = config.norm == "rmsnorm"
        self.weight = nn.Parameter(torch.ones(heads, config.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.rms:
            x = x - x.mean(-1, keepdim=True)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        return x * self.weight.to(x.dtype)


class _SumGradOverGroup(torch.autograd.Function):
    """Identity forward; backward sums the gradient over a process group. A weight replicated over the
    tensor-parallel group but applied to each rank's own heads (a head-wide q/k norm) gets only its heads'
    share of the gradient on each rank; summing restores the full one."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class HeadNorm(nn.Module):
    """A norm over each head's width with one weight shared by the heads (Qwen3, Gemma 3), on
    (B, T, heads, head_dim). `tp_group`, set by tensor parallelism, sums its weight's gradient over the
    ranks that hold the other heads."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = _norm(config, config.head_dim)
        self.tp_group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:
            return self.norm(x)
        weight = _SumGradOverGroup.apply(self.norm.weight, self.tp_group)
        bias = getattr(self.norm, "bias", None)
        bias = None if bias is None else _SumGradOverGroup.apply(bias, self.tp_group)
        if isinstance(self.norm, RMSNorm):
            return _RMSNormFunction.apply(x, weight, self.norm.eps)
        return F.layer_norm(x, self.norm.normalized_shape, weight, bias, self.norm.eps)


def _rope(x: torch.Tensor, fraction: float = 1.0, base: float = 10000.0,
          positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding on (B, T, heads, head_dim), half-split convention, over the first
    `fraction` of each head (GPT-NeoX's partial rotary; the rest passes through). `positions`: the tokens'
    positions in the whole sequence (context parallelism holds only some of them; default 0..T-1)."""
    _, t, _, d = x.shape
    rot = int(d * fraction) // 2 * 2
    half = rot // 2
    inv = 1.0 / (base ** (torch.arange(0, half, dtype=torch.float32, device=x.device) / half))
    pos = torch.arange(t, device=x.device) if positions is None else positions
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype)[:, None], ang.sin().to(x.dtype)[:, None]  # over the heads
    x1, x2, rest = x[..., :half], x[..., half:rot], x[..., rot:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)


def causal_mask(queries: torch.Tensor, keys: torch.Tensor, window: int = 0) -> torch.Tensor:
    """(queries, keys) mask of True = attend from the tokens' positions in the sequence: query i sees keys j ≤ i,
    and with a sliding `window` only i-window+1 .. i."""
    i, j = queries[:, None], keys[None, :]
    return (j <= i) & (i - j < window) if window else j <= i


def each_projection(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """The input projections of a sublayer (q/k/v, the MLP's fc or gate/up, the head's LM projection) applied to
    their one input `x`. Sequence parallelism swaps in a version that gathers `x` once for all of them and keeps
    only its slice for backward (`runtime/tensor_parallel.py`)."""
    return tuple(m(x) for m in linears)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, window: int = 0):
        super().__init__()
        h, hd = config.hidden, config.head_dim
        self.head_dim, self.window = hd, window
        self.rope = not config.learned_positions
        self.rotary_fraction = config.rotary_fraction
        self.q = nn.Linear(h, config.heads * hd, bias=config.qkv_bias)
        self.k = nn.Linear(h, config.n_kv_heads * hd, bias=config.qkv_bias)
        self.v = nn.Linear(h, config.n_kv_heads * hd, bias=config.qkv_bias)
        self.o = nn.Linear(config.heads * hd, h, bias=config.out_bias)
        self.project = each_projection
        self.recompute_core = False  # selective recompute: `core` under activation checkpointing
        self.standard = False  # the standard attention kernel, which keeps the scores (`use_attention_kernel`)
        self.sequence = None  # context parallelism: this rank's part of the sequence (runtime/context_parallel.py)
        self.qk_norm = config.qk_norm
        if self.qk_norm == "head":  # one head_dim-wide norm shared by the heads (Qwen3, Gemma 3)
            self.q_norm, self.k_norm = HeadNorm(config), HeadNorm(config)
        elif self.qk_norm == "heads":  # a weight per head (Cohere)
            self.q_norm, self.k_norm = HeadwiseNorm(config, config.heads), HeadwiseNorm(config, config.n_kv_heads)
        elif self.qk_norm == "full":  # over all heads' width, before the split into heads (OLMo 2)
            self.q_norm = _norm(config, config.heads * hd)
            self.k_norm = _norm(config, config.n_kv_heads * hd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        q, k, v = self.project(x, (self.q, self.k, self.v))
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        # Head counts come from the (possibly tensor-parallel, local) projection outputs. Norms and rotary run on
        # (B, T, heads, head_dim), so that attention gets (B, heads, T, head_dim) views of tensors laid out as
        # (B, T, heads, head_dim): its output then is one too, and the output projection's input, the same
        # tensor as attention's own saved output, is a view rather than a second copy kept for backward.
        q, k, v = (y.view(b, t, -1, hd) for y in (q, k, v))
        if self.qk_norm in ("head", "heads"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            positions = None if self.sequence is None else self.sequence.positions(t, x.device)
            q, k = _rope(q, self.rotary_fraction, positions=positions), _rope(k, self.rotary_fraction,
                                                                                positions=positions)
        # Context parallelism checkpoints the core too: a ring keeps only the local chunk's keys and values, and so
        # does this gather once the core is recomputed (backward gathers them again, as the ring circulates them).
        if (self.recompute_core or self.sequence is not None) and torch.is_grad_enabled():
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core, softmax(QKᵀ/√d)·V on (B, T, heads, head_dim) queries, keys and values; returns
        (B, heads, T, head_dim). What selective recompute recomputes (Korthikanti et al. 2022): under it only
        these inputs are kept, not the scores, nor the keys and values that context parallelism gathers or that
        grouped-query attention repeats."""
        t = q.shape[1]
        mask = None
        if self.sequence is not None:
            k, v = self.sequence.gather(k, v)
            mask = causal_mask(self.sequence.positions(t, q.device), self.sequence.key_positions(t, q.device),
                               self.window)
        elif 0 < self.window < t:
            positions = torch.arange(t, device=q.device)
            mask = causal_mask(positions, positions, self.window)
        q, k, v = (y.transpose(1, 2) for y in (q, k, v))
        if k.shape[1] != q.shape[1]:  # grouped-query attention
            rep = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        with sdpa_kernel(SDPBackend.MATH) if self.standard else nullcontext():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)


def use_attention_kernel(module: nn.Module, attention: str) -> None:
    """Run every attention under `module` with the engine's kernel: "flash" (the default) or "standard"."""
    for m in module.modules():
        if isinstance(m, Attention):
            m.standard = attention == "standard"


class _GatedActivation(torch.autograd.Function):
    """act(gate) · up, keeping for backward only gate and up, as a fused SwiGLU/GeGLU kernel does (eager
    PyTorch would keep act(gate) too, one more tensor of the FFN's width): backward recomputes act(gate)."""

    @staticmethod
    def forward(ctx, act, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.act = act
        ctx.save_for_backward(gate, up)
        return act(gate) * up

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        with torch.enable_grad():
            leaf = gate.detach().requires_grad_()
            activated = ctx.act(leaf)
        (grad_gate,) = torch.autograd.grad(activated, leaf, grad * up)
        return None, grad_gate, grad * activated.detach()


class MLP(nn.Module):
    """The dense MLP (`ffn` wide, `mlp_bias`); an MoE block's shared expert is one of `shared_ffn`, no biases."""

    def __init__(self, config: ModelConfig, ffn: int | None = None, bias: bool | None = None):
        super().__init__()
        self.gated = config.gated_mlp
        self.act = _ACTIVATIONS[config.activation]
        f = config.ffn if ffn is None else ffn
        b = config.mlp_bias if bias is None else bias
        if self.gated:  # SwiGLU / GeGLU: down(act(gate(x)) * up(x))
            self.gate = nn.Linear(config.hidden, f, bias=b)
            self.up = nn.Linear(config.hidden, f, bias=b)
            self.down = nn.Linear(f, config.hidden, bias=b)
        else:
            self.fc = nn.Linear(config.hidden, f, bias=b)
            self.proj = nn.Linear(f, config.hidden, bias=b)
        self.project = each_projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            gate, up = self.project(x, (self.gate, self.up))
            return self.down(_GatedActivation.apply(self.act, gate, up))
        (fc,) = self.project(x, (self.fc,))
        return self.proj(self.act(fc))


AUX_LOSS_COEF = 0.01  # the load-balancing loss's weight α (Switch: 0.01; HF Mixtral's router_aux_loss_coef: 0.001)


def _differentiable_local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor, inside autograd (its gradient lands on the DTensor as its local part)."""
    return t.to_local() if isinstance(t, DTensor) else t


class RoutedExperts(nn.Module):
    """`experts` MLPs of inner size `routed_ffn`, gated like the dense MLP, held as stacked weights (experts, out,
    in) — `gate`, `up`, `down` (or `fc`, `proj`), and `*_bias` (experts, out) with `expert_bias` — so that expert
    parallelism shards dimension 0 and the names stay the same whatever the plan.

    `forward(tokens, chosen, weights)`: every token (N, h) sent to its k chosen experts (N, k), their outputs
    combined with `weights` (N, k). The N·k token copies are sorted by expert and handed to `dispatch(copies,
    counts)` (counts: copies per expert, (experts,)), which returns the experts' outputs in the same order. Here
    it computes every expert locally; expert parallelism swaps in an exchange with the other ranks of the ep group
    that computes only this rank's experts (`runtime/experts.py`)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        e, h, f = config.experts, config.hidden, config.routed_ffn
        self.gated = config.gated_mlp
        self.act = _ACTIVATIONS[config.activation]
        self.inputs, self.output = (("gate", "up"), "down") if self.gated else (("fc",), "proj")
        for name in self.inputs:
            setattr(self, name, nn.Parameter(torch.empty(e, f, h)))
        setattr(self, self.output, nn.Parameter(torch.empty(e, h, f)))
        self.biased = config.expert_bias
        if self.biased:
            for name in self.inputs:
                setattr(self, f"{name}_bias", nn.Parameter(torch.empty(e, f)))
            setattr(self, f"{self.output}_bias", nn.Parameter(torch.empty(e, h)))
        self.dispatch = self.compute

    def _weights(self, name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = _differentiable_local(getattr(self, f"{name}_bias")) if self.biased else None
        return _differentiable_local(getattr(self, name)), bias

    def compute(self, copies: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The experts this rank holds on their token copies: `copies` sorted by expert, `counts[e]` of them for
        the e-th expert held here."""
        inputs = [self._weights(name) for name in self.inputs]
        w_out, b_out = self._weights(self.output)
        outs = []
        for e, x in enumerate(copies.split(counts.tolist())):
            first = [F.linear(x, w[e], None if b is None else b[e]) for w, b in inputs]
            inner = _GatedActivation.apply(self.act, *first) if self.gated else self.act(first[0])
            outs.append(F.linear(inner, w_out[e], None if b_out is None else b_out[e]))
        return torch.cat(outs)

    def forward(self, tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        n, k = chosen.shape
        flat = chosen.reshape(-1)  # copy c = (token c // k, its (c % k)-th expert)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=getattr(self, self.output).shape[0])
        out = self.dispatch(tokens[order // k], counts)
        copies = torch.empty_like(out).index_copy(0, order, out)  # back to token-major order
        return (copies.view(n, k, -1) * weights.unsqueeze(-1).to(copies.dtype)).sum(1)


class _LoadBalancingLoss(torch.autograd.Function):
    """Identity on the MoE output that adds `aux` to the training loss (Megatron's MoEAuxLossAutoScaler): backward
    passes the output's gradient through and gives `aux` the gradient 1 (d loss / d aux). It counts `aux` into
    `moe.aux_loss_spent` there, once per backward however often forward ran (recomputation runs it twice)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, moe: "MoE") -> torch.Tensor:
        ctx.moe = moe
        ctx.save_for_backward(aux)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        ctx.moe.aux_loss_spent = ctx.moe.aux_loss_spent + aux.detach()
        return grad, torch.ones_like(aux), None


class MoE(nn.Module):
    """A mixture-of-experts MLP (Mixtral, Qwen-MoE): a top-k router, routed experts, optional shared expert.

    Routing, per token x (h wide), E = experts, k = experts_per_token, in fp32:
        p = softmax(router(x))                 # (E,) probabilities
        chosen, w = top-k of p                 # k experts and their probabilities
        w = w / Σ w                            # renormalised over the k (Mixtral; the config has no switch)
        y = Σ_i w_i · expert_{chosen_i}(x)     # dropless: every token reaches its k experts, no capacity
        y += shared(x) [· sigmoid(shared_gate(x))]   # on every token when shared_ffn > 0 (Qwen2-MoE's gate)

    Load-balancing loss (Switch Transformer; HF Mixtral's load_balancing_loss_func), per sequence of T tokens:
        f_e = (1/T) Σ_t [e ∈ chosen(t)]        # share of the tokens routed to e (Σ_e f_e = k)
        P_e = (1/T) Σ_t p_e(t)                 # mean router probability of e (Σ_e P_e = 1)
        aux = E · Σ_e f_e · P_e                # k when balanced (f = k/E, P = 1/E); up to E·k if all pick the same
    added to the training loss as α · (mean of aux over the step's sequences) per MoE block, α =
    `aux_loss_coef`. HF and Switch take f and P over the whole batch; taken per sequence (Megatron's
    seq_aux_loss, DeepSeek-V3's sequence-wise balance loss) the loss does not depend on how data parallelism and
    micro-batches split the batch, so a distributed run computes the one-process loss. Only f's argument, p,
    carries a gradient (f counts discrete choices). `samples_per_step`: the sequences the mean runs over (the
    runtime sets the global batch; None: this forward's batch). `aux_loss_spent`: the α·aux this block added,
    summed as backward runs (`take_aux_losses`).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.top_k = config.experts_per_token
        self.router = nn.Linear(config.hidden, config.experts, bias=config.router_bias)
        self.experts = RoutedExperts(config)
        self.shared = MLP(config, config.shared_ffn, bias=False) if config.shared_ffn else None
        self.shared_gate = nn.Linear(config.hidden, 1, bias=False) if config.shared_ffn and config.shared_gate else None
        self.aux_loss_coef = AUX_LOSS_COEF
        self.samples_per_step: int | None = None
        self.aux_loss_spent: torch.Tensor | float = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        tokens = x.reshape(-1, h)
        probs = F.softmax(self.router(tokens).float(), dim=-1)  # (b·t, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        y = self.experts(tokens, chosen, weights)
        if self.shared is not None:
            shared = self.shared(tokens)
            y = y + (shared if self.shared_gate is None else torch.sigmoid(self.shared_gate(tokens)) * shared)
        experts = probs.shape[-1]
        picked = F.one_hot(chosen, experts).sum(1).view(b, t, experts).float()  # [e ∈ chosen(t)]
        per_sequence = experts * (picked.mean(1) * probs.view(b, t, experts).mean(1)).sum(-1)  # (b,)
        aux = self.aux_loss_coef * per_sequence.sum() / (self.samples_per_step or b)
        return _LoadBalancingLoss.apply(y.view(b, t, h), aux, self)


def moe_blocks(module: nn.Module) -> list[MoE]:
    """The MoE MLPs under `module`."""
    return [m for m in module.modules() if isinstance(m, MoE)]


def configure_aux_losses(module: nn.Module, coef: float | None, samples_per_step: int | None = None) -> None:
    """Set the load-balancing weight α (None: keep `AUX_LOSS_COEF`) and the sequences the loss is a mean over
    (None: each forward's batch) on every MoE block under `module`."""
    for moe in moe_blocks(module):
        moe.samples_per_step = samples_per_step
        if coef is not None:
            moe.aux_loss_coef = coef


def take_aux_losses(module: nn.Module) -> float:
    """The load-balancing losses the MoE blocks under `module` added to the training loss since the last call
    (each rank's share: its sequences' terms over the global batch); resets them."""
    total = 0.0
    for moe in moe_blocks(module):
        total += float(moe.aux_loss_spent)
        moe.aux_loss_spent = 0.0
    return total


class Embed(Layer):
    """Token embedding (+ learned positions for GPT-2). Input: int tokens (B, T); output (B, T, H)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab, config.hidden)
        self.pos = nn.Embedding(config.max_seq, config.hidden) if config.learned_positions else None
        self.sequence = None  # context parallelism: the tokens' positions (runtime/context_parallel.py)

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            t = tokens.shape[1]
            positions = torch.arange(t, device=tokens.device) if self.sequence is None else \
                self.sequence.positions(t, tokens.device)
            x = x + self.pos(positions)
        return x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Integer input: nothing to recompute from, and checkpointing gains nothing here.
        return self._forward(tokens)


class Block(Layer):
    """One transformer block. `norm1`/`norm2` precede attention/MLP, `post_norm1`/`post_norm2` follow them
    (OLMo 2: only those; Gemma 2/3: both); a parallel block adds both sublayers to its input, from one
    shared `norm1` (Falcon-7B, Cohere) or from two norms (GPT-NeoX)."""

    def __init__(self, config: ModelConfig, block: int = 0):
        super().__init__()
        pre = config.block_norms in ("pre", "sandwich")
        post = config.block_norms in ("post", "sandwich")
        self.parallel = config.parallel_residual
        self.norm1 = _norm(config) if pre else None
        self.norm2 = _norm(config) if pre and not config.shared_norm else None
        self.post_norm1 = _norm(config) if post else None
        self.post_norm2 = _norm(config) if post else None
        self.attn = Attention(config, config.window_of(block))
        self.mlp = MoE(config) if block in config.moe_layers else MLP(config)

    @staticmethod
    def _maybe(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
        return x if norm is None else norm(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel:
            a = self.norm1(x)
            m = a if self.norm2 is None else self.norm2(x)
            return x + self.attn(a) + self.mlp(m)
        x = x + self._maybe(self.post_norm1, self.attn(self._maybe(self.norm1, x)))
        return x + self._maybe(self.post_norm2, self.mlp(self._maybe(self.norm2, x)))


class Head(Layer):
    """Final norm + LM projection. Output: logits (B, T, vocab)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = _norm(config)
        self.lm = nn.Linear(config.hidden, config.vocab, bias=False)
        self.project = each_projection

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        (logits,) = self.project(self.norm(x), (self.lm,))
        return logits


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, denominator: int | None = None) -> torch.Tensor:
    """Cross-entropy summed over the given tokens and divided by `denominator` (default: their count)."""
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="sum")
    return total / (denominator if denominator is not None else targets.numel())


def _layer_seed(seed: int, index: int) -> int:
    return (int(seed) * 1_000_003 + int(index) * 7_919 + 12_345) % (2**63 - 1)


RESIDUAL_OUTPUTS = ("attn.o.weight", "mlp.proj.weight", "mlp.down.weight", "mlp.experts.proj", "mlp.experts.down",
                    "mlp.shared.proj.weight", "mlp.shared.down.weight")


@torch.no_grad()
def init_layer(module: nn.Module, seed: int, index: int) -> None:
    """Deterministic init of one chain layer: N(0, 0.02) weights (residual outputs scaled as GPT-2),
    zero biases, unit norm weights — drawn from a generator seeded by (seed, layer index)."""
    gen = torch.Generator(device="cpu").manual_seed(_layer_seed(seed, index))
    n_layers = getattr(module, "_n_layers", 1)
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        leaf = name.rsplit(".", 1)[-1]
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        if isinstance(owner, (nn.LayerNorm, nn.RMSNorm, HeadwiseNorm)):
            p.copy_(torch.ones_like(p) if leaf == "weight" else torch.zeros_like(p))
        elif leaf == "bias" or leaf.endswith("_bias"):
            p.zero_()
        else:
            std = INIT_STD
            if name.endswith(RESIDUAL_OUTPUTS):
                std = INIT_STD / math.sqrt(2 * n_layers)
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * std)


def build_layer(config: ModelConfig, index: int, seed: int) -> Layer:
    """Chain layer `index` (0 = embed, 1..L = blocks, L+1 = head), initialised from `seed`."""
    check_supported(config)
    if index == 0:
        mod: Layer = Embed(config)
    elif 1 <= index <= config.layers:
        mod = Block(config, index - 1)
    elif index == config.layers + 1:
        mod = Head(config)
    else:
        raise UniapError(f"layer index {index} outside the chain 0..{config.layers + 1}")
    mod._n_layers = config.layers
    init_layer(mod, seed, index)
    if isinstance(mod, Head) and config.tied_embeddings:
        with torch.no_grad():
            mod.lm.weight.copy_(build_layer(config, 0, seed).tok.weight)
    return mod


class DecoderSlice(nn.Module):
    """Layers `first..last` (inclusive) of the chain, named as in the full model.

    `forward(x)` runs them in order. `between(index, x)`, if set, is called before layer `index`
    (the runtime uses it to re-lay-out activations between layers with different strategies). `layer`, if given,
    supplies chain layer i instead of this decoder's own (`runtime/hf.py`: a `transformers` model's layers).
    """

    def __init__(self, config: ModelConfig, first: int = 0, last: int | None = None, seed: int = 0,
                 layer: Callable[[int], nn.Module] | None = None):
        super().__init__()
        if layer is None:
            check_supported(config)
            layer = partial(build_layer, config, seed=seed)
        n = config.layers + 2
        last = n - 1 if last is None else last
        if not 0 <= first <= last < n:
            raise UniapError(f"bad layer range {first}..{last} for a chain of {n} layers")
        self.config = config
        self.first, self.last = first, last
        self.between = None
        self.embed = layer(0) if first == 0 else None
        self.blocks = nn.ModuleDict({str(i - 1): layer(i) for i in range(max(first, 1), min(last, config.layers) + 1)})
        self.head = layer(n - 1) if last == n - 1 else None

    def chain(self) -> list[tuple[int, Layer]]:
        """(chain index, module) for the layers this slice holds, in order."""
        out: list[tuple[int, Layer]] = []
        if self.embed is not None:
            out.append((0, self.embed))
        out.extend((int(k) + 1, m) for k, m in self.blocks.items())
        if self.head is not None:
            out.append((self.config.layers + 1, self.head))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in self.chain():
            if self.between is not None:
                x = self.between(index, x)
            x = layer(x)
        return x


def build_model(config: ModelConfig, seed: int = 0) -> DecoderSlice:
    """The whole chain in one module (the one-process reference); a tied head shares the embedding's Parameter."""
    model = DecoderSlice(config, 0, None, seed)
    if config.tied_embeddings:
        model.head.lm.weight = model.embed.tok.weight
    return model
