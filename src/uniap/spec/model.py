"""A model as the planner sees it: an architecture config and the chain of layers it becomes.

The chain is what the cost model prices and the solver places; every figure is per *sample*
(one sequence or one image) so the cost model can scale it by any micro-batch size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


# Families that train with dropout, when the config does not say (HF defaults: GPT-2 resid/attn/embd_pdrop
# 0.1, BERT hidden/attention_probs_dropout_prob 0.1, T5 dropout_rate 0.1; every other family defaults to 0.0,
# and Galvatron's ViT-Huge and Swin-Huge configs use 0.0).
DROPOUT_FAMILIES = ("gpt2", "bert", "t5")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture figures (no weights). Field names are ours; `spec.hf` maps Hugging Face names to them.

    Fields left None take the value their family implies (resolved on construction): the q/k/v, output and
    MLP biases follow `bias`, the activation follows `gated_mlp`, dropout follows the family.
    """

    name: str
    family: str  # gpt2 | llama | bert | t5 | vit | swin | a Hugging Face decoder model_type (spec.families)
    layers: int  # transformer blocks (T5: encoder blocks; Swin: sum of `depths`)
    hidden: int
    heads: int
    ffn: int  # MLP inner size
    vocab: int = 0  # 0 for vision models; the config's vocab_size as stored (any padding included)
    kv_heads: int = 0  # 0 means == heads (no grouped-query attention)
    max_seq: int = 1024  # default sequence length (positions); vision: derived from image/patch
    decoder_layers: int = 0  # T5 decoder blocks
    gated_mlp: bool = False  # SwiGLU (Llama): three FFN matrices instead of two
    tied_embeddings: bool = False  # head shares the embedding matrix
    norm: str = "layernorm"  # layernorm | rmsnorm
    bias: bool = True  # linear layers carry biases
    learned_positions: bool = True  # GPT-2/BERT/ViT position table; Llama uses RoPE (no parameters)
    image_size: int = 0  # vision
    patch_size: int = 0
    channels: int = 3
    num_classes: int = 0
    depths: tuple[int, ...] = ()  # Swin blocks per stage
    window: int = 7  # Swin attention window
    type_vocab: int = 0  # BERT token types
    kv_channels: int = 0  # per-head width when heads × it != hidden (GPT-3 13B, T5-3B/11B); 0 = hidden // heads
    qkv_bias: bool | None = None  # q/k/v projections carry biases (Qwen2: yes, with `bias` off); None: `bias`
    out_bias: bool | None = None  # the attention output projection carries a bias; None: `bias`
    mlp_bias: bool | None = None  # the MLP matrices carry biases; None: `bias`
    norm_bias: bool = True  # a LayerNorm has a bias (Cohere's has none); RMSNorm never has one
    activation: str | None = None  # MLP activation: silu | gelu | gelu_tanh | relu; None: silu gated, gelu_tanh not
    dropout: bool | None = None  # trains with dropout; None: the family's default (DROPOUT_FAMILIES)
    qk_norm: str = ""  # norm of queries and keys: "" none | head (one head_dim-wide norm shared by the heads,
    #                    Qwen3, Gemma 3) | heads (one weight per head, Cohere) | full (over all heads, OLMo 2)
    block_norms: str = "pre"  # pre: a norm before each sublayer | post: a norm after each (OLMo 2) |
    #                           sandwich: both (Gemma 2/3)
    parallel_residual: bool = False  # attention and MLP read the same block input (GPT-NeoX, Falcon, Cohere)
    shared_norm: bool = False  # parallel residual with one norm feeding both sublayers (Falcon-7B, Cohere)
    rotary_fraction: float = 1.0  # share of each head's width RoPE rotates (GPT-NeoX rotary_pct 0.25)
    sliding_window: int = 0  # keys a query attends to in a sliding-window layer (0: none)
    sliding_layers: tuple[int, ...] = ()  # blocks (0-based) that use the sliding window; the others attend fully
    attn_softcap: float = 0.0  # tanh soft-capping of attention scores (Gemma 2); 0: none
    logit_softcap: float = 0.0  # tanh soft-capping of the final logits (Gemma 2); 0: none
    # Mixture of experts (Mixtral, Qwen2/3-MoE, DeepSeek-V3, gpt-oss, Llama 4): an MoE block's MLP is a router
    # over `experts` routed experts, of which each token uses `experts_per_token`, plus optional shared experts.
    experts: int = 0  # routed experts per MoE block (0: a dense model)
    experts_per_token: int = 0  # top-k: routed experts each token is sent to
    expert_ffn: int = 0  # inner size of one routed expert (0: ffn); experts are gated like the dense MLP
    shared_ffn: int = 0  # inner size of the always-active shared expert(s), summed over them (0: none)
    shared_gate: bool = False  # a sigmoid gate (h → 1) scales the shared expert's output (Qwen2-MoE)
    moe_layers: tuple[int, ...] = ()  # blocks (0-based) whose MLP is MoE; the others are dense (ffn). Resolved:
    #                                   every block when experts > 0 and the field is empty
    router_bias: bool = False  # the router's linear carries a bias (gpt-oss)
    expert_bias: bool = False  # the routed experts' matrices carry biases (gpt-oss)
    # Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values pass through low-rank latents.
    q_lora_rank: int = 0  # latent width of the queries (0: a full-rank query projection)
    kv_lora_rank: int = 0  # latent width of keys and values; > 0 switches MLA on
    qk_rope_dim: int = 0  # per-head width of the rotary part of queries and keys (one shared rotary key)
    qk_nope_dim: int = 0  # per-head width of the non-rotary part of queries and keys
    v_head_dim: int = 0  # per-head width of the values (0: head_dim)
    mtp_layers: int = 0  # multi-token-prediction modules after the last block (DeepSeek-V3: 1)
    attn_sinks: bool = False  # a learned logit per head joins each softmax (gpt-oss): `heads` parameters a block

    def __post_init__(self):
        for name in ("depths", "sliding_layers", "moe_layers"):  # JSON gives lists
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("qkv_bias", "out_bias", "mlp_bias"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.bias)
        if self.activation is None:
            object.__setattr__(self, "activation", "silu" if self.gated_mlp else "gelu_tanh")
        if self.dropout is None:
            object.__setattr__(self, "dropout", self.family in DROPOUT_FAMILIES)
        if self.experts and not self.moe_layers:
            object.__setattr__(self, "moe_layers", tuple(range(self.layers)))

    def to_json(self) -> dict:
        """The fields as JSON values (tuples as lists); `ModelConfig(**that)` gives this config back."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def routed_ffn(self) -> int:
        """Inner size of one routed expert."""
        return self.expert_ffn or self.ffn

    def window_of(self, block: int) -> int:
        """Keys per query of block `block` (0 = full attention)."""
        return self.sliding_window if block in self.sliding_layers else 0


@dataclass(frozen=True)
class LayerSpec:
    """One placeable layer of the chain, with everything the cost model needs, per sample.

    Activation figures follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
    Transformer Models", Megatron-LM): bytes kept for backward per layer with 16-bit activations,
    split into the part tensor parallelism shards (`act_tp`), the part it leaves replicated unless
    sequence parallelism is on (`act_other`), and the attention-score part that flash attention
    removes (`act_scores`). fp32 activations double them (see cost.memory).
    """

    name: str  # "embed", "block.3", "enc.0", "dec.5", "swin.2.1", "head", ...
    kind: str  # embedding | block | head | patch_embed | merge | ...
    params: int  # parameters held by this layer
    tp_params: int  # of those, the ones tensor parallelism shards (norms and some biases stay replicated)
    flops: float  # forward FLOPs per sample (2·m·n·k per matmul, plus attention scores and values)
    tokens: int  # positions processed per sample (sequence length, patches, windows × tokens)
    width: int  # hidden size of the activation flowing through this layer
    act_tp: float  # bytes/sample kept for backward that tp shards
    act_other: float  # bytes/sample kept for backward that tp leaves replicated (sp shards them)
    act_scores: float  # bytes/sample of attention scores/softmax/dropout kept (0 with flash attention)
    act_input: float  # bytes/sample of the layer input: all a recomputed layer keeps
    out_elems: int  # elements/sample of the activation handed to the next layer
    tp_comm_elems: int  # elements/sample all-reduced by tp in forward (2·s·h for a Megatron block); same backward
    tp_divides: tuple[int, ...] = ()  # sizes a tp degree must divide (heads, kv heads, ffn, vocab)
    # Mixture of experts (0 in a dense layer). The routed experts do not follow the layer's dp × tp: expert
    # parallelism ep places experts/ep of them on each device, expert tensor parallelism etp splits each, and
    # dispatch (an all-to-all over the ep group) brings every token to the devices of its top-k experts.
    experts: int = 0  # routed experts (ep must divide it)
    expert_ffn: int = 0  # inner size of one routed expert (etp must divide it)
    expert_params: int = 0  # of `params`, the routed experts' (sharded by ep·etp, not by tp)
    routed_elems: int = 0  # elements/sample dispatch sends (tokens × top-k × hidden); combine returns as many
    act_routed: float = 0.0  # bytes/sample the routed experts keep for backward (the stage's devices share them
    #                          through dispatch; etp leaves them whole: dispatched inputs, expert outputs)
    act_routed_etp: float = 0.0  # bytes/sample the routed experts keep that etp shards (their inner activations)
    ops: tuple = field(default=(), compare=False)  # spec.ops operators of the forward pass (what cost.compute prices)
    signature: tuple = field(default=())  # equal signatures => identical layers (the solver folds them)


@dataclass(frozen=True)
class ModelSpec:
    """A model ready for costing: its config, the sequence length used, and its layer chain."""

    config: ModelConfig
    seq_len: int
    layers: tuple[LayerSpec, ...]
    tied_params: int = 0  # parameters held by two layers (tied embedding and head): counted once in `parameters`
    hf_config: dict | None = field(default=None, compare=False, hash=False)  # the Hugging Face config it was read
    #                                          from, if any (a plan carries it so transformers can build the model)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def parameters(self) -> int:
        return sum(layer.params for layer in self.layers) - self.tied_params

    @property
    def active_parameters(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to, (E - k) of the E experts'
        weights in every MoE block (an expert's weights are an E-th of the block's `expert_params`)."""
        k = self.config.experts_per_token
        idle = sum(layer.expert_params // layer.experts * (layer.experts - k) for layer in self.layers if layer.experts)
        return self.parameters - idle

    def flops_per_sample(self) -> float:
        """Forward FLOPs of one sample through the whole chain."""
        return sum(layer.flops for layer in self.layers)


FIRST_CONFIG_FIELDS = frozenset((
    "family", "layers", "hidden", "heads", "ffn", "vocab", "kv_heads", "max_seq", "decoder_layers", "gated_mlp",
    "tied_embeddings", "norm", "bias", "learned_positions", "image_size", "patch_size", "channels", "num_classes",
    "depths", "window", "type_vocab", "kv_channels"))
"""The ModelConfig fields the first plans hashed. Fields added since (the decoder families' options) enter the hash
only where they differ from what these imply, so an id written before they existed keeps its value."""


def architecture_id(config: ModelConfig, seq_len: int, world_size: int | None = None) -> str:
    """The one fingerprint: a short hash of the architecture (name excluded) and the sequence length, what a
    profile's layer figures and a checkpoint's tensors depend on; with `world_size`, what a plan depends on.
    A field added to ModelConfig leaves every id as it was where the field keeps the value the others imply."""
    from uniap.jsonfile import digest

    implied = asdict(ModelConfig(name=config.name, **{k: getattr(config, k) for k in FIRST_CONFIG_FIELDS}))
    arch = {k: v for k, v in asdict(config).items()
            if k != "name" and (k in FIRST_CONFIG_FIELDS or v != implied[k])}
    key = {"arch": arch, "seq_len": int(seq_len)}
    if world_size is not None:
        key["world"] = int(world_size)
    return digest(key)
