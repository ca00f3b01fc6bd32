"""A `transformers` decoder as the runtime's chain of layers, so that a plan runs on the user's own model.

A `*ForCausalLM` of a supported family (`HF_FAMILIES`) is cut, without copying a weight, into the chain the plan
names: `embed` (token embeddings, plus GPT-2's learned positions), `block.i` (the model's own decoder layer i) and
`head` (final norm and LM projection). Each is wrapped in a chain layer (`HFEmbed`, `HFBlock`, `HFHead`) whose
children carry the names of our own decoder's layers (`embed.tok`, `blocks.i.inner`, `head.norm`, `head.lm`),
so that pipelining, data parallelism, ZeRO, recompute, mixed precision and tied embeddings run through the same
runtime code as `uniap.models.decoder`; `hf_name` maps those names back to the model's own.

What the model-level forward does between its layers is done here, as `transformers` 5.18 does it: positions
0..T−1, the rotary embedding of the layer's type (Gemma 3 has one per type), the causal or sliding-window mask
of the layer's type, Gemma 2/3's final logit soft-capping. `tests/runtime/test_hf_runtime.py` checks the chain
against the model's own forward for every family.

Tensor parallelism follows the model's own `base_model_tp_plan` ("colwise", "rowwise", and
"replicated_with_grad_allreduce" for q/k norms applied to local heads); the embedding is vocabulary-parallel and
the LM head column-parallel with gathered logits, as the cost model prices them. Under sequence parallelism the
norms run on sequence slices (`SequenceParallel`), attention's and the MLP's inputs are all-gathered once and
their row-split outputs reduce-scattered back, as torchtitan lays a Llama out. DTensor keeps the gathered inputs
for backward here, so sp saves less activation memory than the cost model credits (our own decoder keeps only
the slice, `tensor_parallel.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from uniap.errors import UniapError
from uniap.models.decoder import Layer

SEQ = Shard(1)


@dataclass(frozen=True)
class Family:
    """Where a family's `*ForCausalLM` keeps the pieces of the chain (attribute names)."""

    base: str
    """The decoder under the LM head (`model`, `transformer`, `gpt_neox`)."""
    tok: str
    """Token embedding, on `base`."""
    layers: str
    """The list of decoder layers, on `base`."""
    norm: str
    """Final norm, on `base`."""
    head: str = "lm_head"
    """LM projection, on the CausalLM."""
    pos: str = ""
    """Learned position embedding on `base` (GPT-2's `wpe`); "" for rotary families."""
    drop: str = ""
    """Embedding dropout on `base`, if the family has one."""


_LLAMA_LIKE = Family("model", "embed_tokens", "layers", "norm")
HF_FAMILIES = {
    **{t: _LLAMA_LIKE for t in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
                                "olmo2", "starcoder2")},
    "gpt_neox": Family("gpt_neox", "embed_in", "layers", "final_layer_norm", drop="emb_dropout"),
    "gpt2": Family("transformer", "wte", "h", "ln_f", pos="wpe", drop="drop"),
}
DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout",
                  "embedding_dropout", "residual_dropout", "mlp_dropout", "classifier_dropout")
"""Config fields of a dropout probability in the families' configs (transformers 5.18)."""
TP_STYLES = ("colwise", "rowwise", "replicated_with_grad_allreduce", "embedding_rowwise")


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise UniapError("`transformers` is not installed: pip install 'uniap[hf]' (make setup installs it)") from None
    return transformers


def family_of(model_type: str) -> Family:
    if model_type not in HF_FAMILIES:
        raise UniapError(f"no transformers adapter for model_type {model_type!r} (families: "
                         f"{', '.join(HF_FAMILIES)})")
    return HF_FAMILIES[model_type]


def block_tp_plan(hf_config) -> dict[str, str]:
    """The model's own tensor-parallel plan of one decoder layer: {submodule path: style}."""
    plan = getattr(hf_config, "base_model_tp_plan", None) or {}
    return {key[len("layers.*."):]: style for key, style in plan.items() if key.startswith("layers.*.")}


def tp_refusal(hf_config) -> str | None:
    """Why this model's layers cannot run tensor-parallel here, or None."""
    plan = block_tp_plan(hf_config)
    if not plan:
        return f"{hf_config.model_type} has no base_model_tp_plan in transformers"
    odd = sorted({f"{path}: {style}" for path, style in plan.items() if style not in TP_STYLES})
    if odd:
        return (f"{hf_config.model_type}'s tensor-parallel plan uses styles this runtime does not apply "
                f"({'; '.join(odd)})")
    return None


def hf_config_of(plan) -> dict:
    """The Hugging Face config a plan's model was read from (a zoo model of the gpt2 or llama family: its own)."""
    from uniap.spec.hf import zoo_hf_config

    return plan.model.hf_config or zoo_hf_config(plan.model_config())


def check_hf_plan(plan, config) -> None:
    """What this adapter cannot run of a plan, refused in one line each before any process starts."""
    require_transformers()
    family_of(hf_config_of(plan).get("model_type"))
    if config.is_moe:
        raise UniapError(f"{config.name}: mixture-of-experts models do not run on transformers here")
    hf = hf_config_of(plan)
    dropout = {k: v for k, v in hf.items() if k in DROPOUT_FIELDS and isinstance(v, (int, float)) and v > 0}
    tp_why = None
    for layer in plan.layers:
        st = layer.strategy
        if st.recompute == "selective":
            raise UniapError(f"layer {layer.name}: selective recompute of the attention core needs our decoder's "
                             f"attention; on transformers use selective-op or full")
        if st.cp > 1:
            raise UniapError(f"layer {layer.name}: context parallelism (cp {st.cp}) does not run on transformers "
                             f"here (its attention takes whole sequences)")
        if st.tp > 1 and dropout:
            rates = ", ".join(f"{k} {v}" for k, v in dropout.items())
            raise UniapError(f"layer {layer.name}: tp {st.tp} with dropout ({rates}) would draw different masks on "
                             f"the tp ranks; set it to 0 or plan without tp")
        if st.tp > 1 and layer.name.startswith("block."):
            if tp_why is None:
                tp_why = tp_refusal(_hf_config_object(hf_config_of(plan))) or ""
            if tp_why:
                raise UniapError(f"layer {layer.name}: tp {st.tp}: {tp_why}")


def _hf_config_object(hf_config: dict):
    """The transformers config of a dict, without the library's warnings on fields of tiny test configs (token
    ids beyond a small vocabulary), so that a refusal stays one line."""
    transformers = require_transformers()
    data = dict(hf_config)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    finally:
        transformers.logging.set_verbosity(verbosity)


def build_hf_model(hf_config: dict, seed: int, attention: str = "flash"):
    """A `*ForCausalLM` from a config dict (its `model_type` names the class), initialised from `seed`, in fp32,
    without dropout unless the config sets it. attention "standard" runs transformers' eager attention, "flash"
    its SDPA (flash kernels where the device has them)."""
    transformers = require_transformers()
    family_of(hf_config.get("model_type"))
    config = _hf_config_object(hf_config)
    torch.manual_seed(seed)
    impl = "eager" if attention == "standard" else "sdpa"
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.float32)


class _Context:
    """What the model-level forward computes for its layers: positions, masks and rotary embeddings. They depend on
    the shapes alone (whole sequences of `seq_len` tokens, no padding) and carry no gradient, so each is built once
    per (layer type, micro-batch rows, dtype, device) and reused by every layer and step."""

    def __init__(self, hf_config, rotary: nn.Module | None, seq_len: int):
        self.config, self.rotary, self.seq_len = hf_config, rotary, seq_len
        self._built: dict[tuple, dict] = {}

    def layer_kwargs(self, x: torch.Tensor, layer_type: str) -> dict:
        local = x.to_local() if isinstance(x, DTensor) else x
        key = (layer_type, local.shape[0], local.dtype, local.device)
        if key not in self._built:
            with torch.no_grad():
                self._built[key] = self._build(local, layer_type)
        return self._built[key]

    def _build(self, local: torch.Tensor, layer_type: str) -> dict:
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        stand_in = local.new_empty((local.shape[0], self.seq_len, 0))  # the whole sequence, for mask shapes
        positions = torch.arange(self.seq_len, device=local.device).unsqueeze(0)
        sliding = layer_type == "sliding_attention"
        mask_fn = create_sliding_window_causal_mask if sliding else create_causal_mask
        out = {"attention_mask": mask_fn(config=self.config, inputs_embeds=stand_in, attention_mask=None,
                                         past_key_values=None, position_ids=positions),
               "position_ids": positions}
        if self.rotary is not None:
            args = (layer_type,) if self.config.model_type == "gemma3_text" else ()
            out["position_embeddings"] = self.rotary(stand_in, positions, *args)
        return out


def _layer_type(hf_config, index: int) -> str:
    types = getattr(hf_config, "layer_types", None)
    if types:
        return types[index]
    return "sliding_attention" if getattr(hf_config, "sliding_window", None) else "full_attention"


class HFEmbed(Layer):
    """Chain layer 0: the token embedding (Gemma's scales itself), GPT-2's learned positions, the dropout."""

    def __init__(self, tok: nn.Embedding, pos: nn.Embedding | None, drop: nn.Module | None):
        super().__init__()
        self.tok, self.pos, self.drop = tok, pos, drop

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device).unsqueeze(0))
        return self.drop(x) if self.drop is not None else x

    def tensor_parallel(self, mesh: DeviceMesh, sp: bool) -> None:
        """Vocabulary-parallel token embedding, output replicated (positions stay replicated)."""
        parallelize_module(self, mesh, {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())})


class HFBlock(Layer):
    """A decoder layer of the model (`inner`), called as the model-level forward calls it."""

    def __init__(self, inner: nn.Module, context: _Context, index: int):
        super().__init__()
        self.inner = inner
        self._context, self._type = context, _layer_type(context.config, index)
        self._gpt2 = context.config.model_type == "gpt2"

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs = self._context.layer_kwargs(x, self._type)
        if self._gpt2:  # GPT-2's block takes no positions
            kwargs = {"attention_mask": kwargs["attention_mask"]}
        out = self.inner(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def tensor_parallel(self, mesh: DeviceMesh, sp: bool) -> None:
        """The model's own tp plan for its layers, with sequence parallelism on top when `sp`."""
        config = self._context.config
        why = tp_refusal(config)
        if why:
            raise UniapError(f"{why}: plan it without tensor parallelism (--max-tp 1)")
        styles = {}
        for path, style in block_tp_plan(config).items():
            if style == "colwise":
                styles[path] = ColwiseParallel()
            elif style == "rowwise":
                styles[path] = RowwiseParallel(output_layouts=SEQ) if sp else RowwiseParallel()
            elif style == "replicated_with_grad_allreduce":  # a norm applied to the rank's own heads
                _sum_gradients(self.inner.get_submodule(path), mesh.get_group())
        parallelize_module(self.inner, mesh, styles)
        if sp:
            split = {path.split(".")[0] for path in styles}  # the attention and the MLP
            for name, child in self.inner.named_children():
                if name in split:
                    child.register_forward_pre_hook(_gather_input(mesh), with_kwargs=True)
                elif "norm" in name.lower():
                    parallelize_module(child, mesh, SequenceParallel(use_local_output=True))


class HFHead(Layer):
    """The last chain layer: final norm, LM projection and the family's logit soft-capping."""

    def __init__(self, norm: nn.Module, lm: nn.Linear, softcap: float | None):
        super().__init__()
        self.norm, self.lm, self.softcap = norm, lm, softcap

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm(self.norm(x))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def tensor_parallel(self, mesh: DeviceMesh, sp: bool) -> None:
        """Column-parallel LM projection, logits gathered; under sp the norm runs on the sequence slice and the
        projection gathers its input."""
        if sp:
            plan = {"norm": SequenceParallel(), "lm": ColwiseParallel(input_layouts=SEQ, output_layouts=Replicate())}
        else:
            plan = {"lm": ColwiseParallel(output_layouts=Replicate())}
        parallelize_module(self, mesh, plan)


def _sum_gradients(module: nn.Module, group: dist.ProcessGroup) -> None:
    """A replicated module applied to each rank's own heads: its weight gradient is the sum over tp."""
    for p in module.parameters():
        def summed(grad: torch.Tensor) -> torch.Tensor:
            grad = grad.clone()
            dist.all_reduce(grad, group=group)
            return grad
        p.register_hook(summed)


def _gather_input(mesh: DeviceMesh):
    """A forward pre-hook that all-gathers a sublayer's sequence-sliced input (positional or `hidden_states`) to the
    whole sequence as a replicated DTensor; backward reduce-scatters its gradient (DTensor's adjoint)."""

    def gather(x: torch.Tensor) -> torch.Tensor:
        return DTensor.from_local(x, mesh, (SEQ,), run_check=False).redistribute(mesh, (Replicate(),))

    def hook(_module, args, kwargs):
        if args:
            return (gather(args[0]),) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}

    return hook


class HFChain:
    """A `*ForCausalLM` seen as the chain embed, block.0 .. block.{L−1}, head (see the module docstring).

    Tied embeddings: the head gets its own copy of the embedding matrix (the runtime sums the two copies'
    gradients, `tied.py`), so that each can be laid out by its own layer's strategy.
    """

    def __init__(self, model: nn.Module, seq_len: int):
        config = model.config
        self.config = config
        self.family = family = family_of(config.model_type)
        base = getattr(model, family.base)
        self.layers = config.num_hidden_layers
        context = _Context(config, getattr(base, "rotary_emb", None), seq_len)
        self.tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        self.embed = HFEmbed(getattr(base, family.tok), getattr(base, family.pos) if family.pos else None,
                             getattr(base, family.drop) if family.drop else None)
        self.blocks = [HFBlock(layer, context, i) for i, layer in enumerate(getattr(base, family.layers))]
        lm = getattr(model, family.head)
        if self.tied:
            untied = nn.Linear(lm.in_features, lm.out_features, bias=lm.bias is not None, device=lm.weight.device)
            with torch.no_grad():
                untied.weight.copy_(lm.weight)
            lm = untied
        self.head = HFHead(getattr(base, family.norm), lm, getattr(config, "final_logit_softcapping", None))

    def layer(self, index: int) -> Layer:
        """Chain layer `index` (0: embed, 1..L: blocks, L+1: head)."""
        if index == 0:
            return self.embed
        return self.blocks[index - 1] if index <= self.layers else self.head

    def hf_name(self, name: str) -> str:
        """The model's own name of a parameter named as the runtime names it (`embed.tok.weight`, ...)."""
        f = self.family
        first, _, rest = name.partition(".")
        if first == "embed":
            part, _, tail = rest.partition(".")
            return f"{f.base}.{f.tok if part == 'tok' else f.pos}.{tail}"
        if first == "blocks":
            index, _, tail = rest.partition(".")
            return f"{f.base}.{f.layers}.{index}.{tail.removeprefix('inner.')}"
        part, _, tail = rest.partition(".")
        return f"{f.base}.{f.norm}.{tail}" if part == "norm" else f"{f.head}.{tail}"


def hf_chain(shape, seed: int, device: torch.device) -> HFChain:
    """The chain of the transformers model a checked plan names, built from `seed` on every rank alike."""
    model = build_hf_model(hf_config_of(shape.plan), seed, shape.attention).to(device)
    return HFChain(model, shape.seq_len)
