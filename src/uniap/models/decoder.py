"""Decoder-only transformers (GPT-2 and Llama families) as a chain of separately placeable layers.

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
attention runs on local (per-rank) tensors with `F.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from uniap.errors import UniapError
from uniap.spec.model import ModelConfig

FAMILIES = ("gpt2", "llama")
INIT_STD = 0.02


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


class Layer(nn.Module):
    """A chain layer. `recompute=True` wraps its computation in activation checkpointing.

    The checkpoint sits inside `forward`, so hooks a data-parallel wrapper puts around the module
    (parameter gathering) run outside the recomputed region, as with a checkpoint wrapper.
    """

    recompute: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


def _norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden, eps=1e-5)
    return nn.LayerNorm(config.hidden, eps=1e-5, bias=config.bias)


def _rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding on (B, heads, T, head_dim), half-split convention."""
    _, _, t, d = x.shape
    half = d // 2
    inv = 1.0 / (base ** (torch.arange(0, half, dtype=torch.float32, device=x.device) / half))
    ang = torch.arange(t, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        h, hd = config.hidden, config.head_dim
        self.head_dim = hd
        self.rope = not config.learned_positions
        self.q = nn.Linear(h, config.heads * hd, bias=config.bias)
        self.k = nn.Linear(h, config.n_kv_heads * hd, bias=config.bias)
        self.v = nn.Linear(h, config.n_kv_heads * hd, bias=config.bias)
        self.o = nn.Linear(config.heads * hd, h, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        # Head counts come from the (possibly tensor-parallel, local) projection outputs.
        q = self.q(x).view(b, t, -1, hd).transpose(1, 2)
        k = self.k(x).view(b, t, -1, hd).transpose(1, 2)
        v = self.v(x).view(b, t, -1, hd).transpose(1, 2)
        if self.rope:
            q, k = _rope(q), _rope(k)
        if k.shape[1] != q.shape[1]:  # grouped-query attention
            rep = q.shape[1] // k.shape[1]
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, -1)
        return self.o(y)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gated = config.gated_mlp
        if self.gated:  # SwiGLU: down(silu(gate(x)) * up(x))
            self.gate = nn.Linear(config.hidden, config.ffn, bias=config.bias)
            self.up = nn.Linear(config.hidden, config.ffn, bias=config.bias)
            self.down = nn.Linear(config.ffn, config.hidden, bias=config.bias)
        else:
            self.fc = nn.Linear(config.hidden, config.ffn, bias=config.bias)
            self.proj = nn.Linear(config.ffn, config.hidden, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Embed(Layer):
    """Token embedding (+ learned positions for GPT-2). Input: int tokens (B, T); output (B, T, H)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab, config.hidden)
        self.pos = nn.Embedding(config.max_seq, config.hidden) if config.learned_positions else None

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Integer input: nothing to recompute from, and checkpointing gains nothing here.
        return self._forward(tokens)


class Block(Layer):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm1 = _norm(config)
        self.attn = Attention(config)
        self.norm2 = _norm(config)
        self.mlp = MLP(config)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Head(Layer):
    """Final norm + LM projection. Output: logits (B, T, vocab)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = _norm(config)
        self.lm = nn.Linear(config.hidden, config.vocab, bias=False)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, denominator: int | None = None) -> torch.Tensor:
    """Cross-entropy summed over the given tokens and divided by `denominator` (default: their count)."""
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="sum")
    return total / (denominator if denominator is not None else targets.numel())


def _layer_seed(seed: int, index: int) -> int:
    return (int(seed) * 1_000_003 + int(index) * 7_919 + 12_345) % (2**63 - 1)


@torch.no_grad()
def init_layer(module: nn.Module, seed: int, index: int) -> None:
    """Deterministic init of one chain layer: N(0, 0.02) weights (residual outputs scaled as GPT-2),
    zero biases, unit norm weights — drawn from a generator seeded by (seed, layer index)."""
    gen = torch.Generator(device="cpu").manual_seed(_layer_seed(seed, index))
    n_layers = getattr(module, "_n_layers", 1)
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        leaf = name.rsplit(".", 1)[-1]
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        if isinstance(owner, (nn.LayerNorm, nn.RMSNorm)):
            p.copy_(torch.ones_like(p) if leaf == "weight" else torch.zeros_like(p))
        elif leaf == "bias":
            p.zero_()
        else:
            std = INIT_STD
            if name.endswith(("attn.o.weight", "mlp.proj.weight", "mlp.down.weight")):
                std = INIT_STD / math.sqrt(2 * n_layers)
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * std)


def build_layer(config: ModelConfig, index: int, seed: int) -> Layer:
    """Chain layer `index` (0 = embed, 1..L = blocks, L+1 = head), initialised from `seed`."""
    check_supported(config)
    if index == 0:
        mod: Layer = Embed(config)
    elif 1 <= index <= config.layers:
        mod = Block(config)
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
    (the runtime uses it to re-lay-out activations between layers with different strategies).
    """

    def __init__(self, config: ModelConfig, first: int = 0, last: int | None = None, seed: int = 0):
        super().__init__()
        check_supported(config)
        n = config.layers + 2
        last = n - 1 if last is None else last
        if not 0 <= first <= last < n:
            raise UniapError(f"bad layer range {first}..{last} for a chain of {n} layers")
        self.config = config
        self.first, self.last = first, last
        self.between = None
        self.embed = build_layer(config, 0, seed) if first == 0 else None
        self.blocks = nn.ModuleDict({str(i - 1): build_layer(config, i, seed)
                                     for i in range(max(first, 1), min(last, config.layers) + 1)})
        self.head = build_layer(config, n - 1, seed) if last == n - 1 else None

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
