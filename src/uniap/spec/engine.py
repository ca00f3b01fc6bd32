"""The training engine's kernels, as far as they change cost: fused or eager element-wise work, and the attention.

Two runs of one plan on one cluster differ by 1.3–2× with the software that runs them: Megatron-style
engines fuse norms, activations, dropout and residuals into a few kernels, eager PyTorch launches one
kernel per operator; flash attention never materialises the score matrix, the standard kernel keeps it
(time and memory). `uniap` costs a plan under one stated Engine, recorded in the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from uniap.errors import UniapError

KERNELS = ("fused", "eager")
ATTENTIONS = ("flash", "sdpa", "standard")


@dataclass(frozen=True)
class Engine:
    """How the plan's operators run.

    kernels: "eager" (default) is plain PyTorch — our runtime and torchtitan without torch.compile — one
    kernel per operator; "fused" is Megatron-LM/Transformer Engine or torch.compile, element-wise chains
    fused into single kernels. The default is eager because it is what `uniap run` executes: a plan for
    another engine is one flag away, and an eager prediction never promises more than our runtime gives.
    attention: "flash" (FlashAttention) keeps no score matrix, and runs the engine's kernel: PyTorch SDPA's
    (FlashAttention-2) under eager kernels, Transformer Engine's (cuDNN / FlashAttention-3) under fused ones;
    "sdpa" is flash attention through PyTorch SDPA whatever the kernels (torch.compile fuses the element-wise
    work but leaves attention to SDPA: torchtitan); "standard" materialises softmax(QKᵀ) as Megatron-LM did
    before flash attention (and as SDPA's math path does).
    tp_overlap: tensor-parallel communication overlapped with the GEMMs it feeds, under sequence parallelism:
    Transformer Engine's userbuffers (`tp_comm_overlap`, on in NeMo's and Megatron-LM's H100 recipes) and
    torchtitan's async TP both split each all-gather / reduce-scatter into chunks pipelined with the matmul's
    (Wang et al. 2022, "Overlap communication with dependent computation via decomposition"). Off: tp's
    collectives sit on the critical path.
    """

    kernels: str = "eager"
    attention: str = "flash"
    tp_overlap: bool = False

    def __post_init__(self) -> None:
        if self.kernels not in KERNELS:
            raise UniapError(f"unknown kernels {self.kernels!r} (choose {' or '.join(KERNELS)})")
        if self.attention not in ATTENTIONS:
            raise UniapError(f"unknown attention {self.attention!r} (choose {' or '.join(ATTENTIONS)})")

    @property
    def flash(self) -> bool:
        return self.attention in ("flash", "sdpa")

    @property
    def fused_attention(self) -> bool:
        """Whether attention runs a fused engine's kernel (Transformer Engine's) rather than PyTorch SDPA's."""
        return self.attention == "flash" and self.kernels == "fused"

    def to_json(self) -> dict:
        data = {"kernels": self.kernels, "attention": self.attention}
        if self.tp_overlap:
            data["tp_overlap"] = True
        return data

    @classmethod
    def from_json(cls, data: dict | None, default: "Engine") -> "Engine":
        data = data or {}
        if not isinstance(data, dict):
            raise UniapError(f"engine must be a mapping with kernels and attention, got {data!r}")
        return cls(kernels=str(data.get("kernels", default.kernels)),
                   attention=str(data.get("attention", default.attention)),
                   tp_overlap=bool(data.get("tp_overlap", default.tp_overlap)))

    def label(self) -> str:
        return f"{self.kernels} kernels, {self.attention} attention" + (", tp overlap" if self.tp_overlap else "")
