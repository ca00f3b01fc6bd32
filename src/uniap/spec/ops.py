"""The operators of one layer's forward pass, per sample, as the cost model prices them.

A layer is a short list of operators on the tensors of one sample; the cost model (`cost.compute`)
scales them by the per-device micro-batch, splits them by the strategy's tensor parallelism and prices
each kind its own way: GEMMs by their shape, attention as its own kernel, element-wise work by the
bytes it moves. The spec only says *what* runs; how fast it runs on a device is the cost model's.
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Gemm:
    """`count` matmuls (rows × k) @ (k × n) per sample, `rows` = the tokens of one sample.

    split: the dimension tensor parallelism divides: "n" column-parallel (QKV, fc1, gate/up, the
    vocabulary of an LM head), "k" row-parallel (attention output, fc2), "" replicated.
    """

    rows: int
    k: int
    n: int
    split: str = ""
    count: int = 1


@dataclass(frozen=True)
class GroupedGemm:
    """The routed experts' matmuls: `rows` tokens per sample, each sent to `topk` of `experts` experts; every
    expert multiplies the tokens it receives, (rows·topk/experts × k) @ (k × n), `count` such matrices each.

    Priced on the devices expert parallelism gives it (cost.compute): experts/ep experts per device, over
    the tokens of the device's expert-data-parallel share, times the workload's load-imbalance factor.
    split: the dimension expert tensor parallelism (etp) divides, as Gemm.split does for tp.
    """

    rows: int
    k: int
    n: int
    experts: int
    topk: int
    split: str = ""
    count: int = 1


@dataclass(frozen=True)
class Attention:
    """Scaled dot-product attention of one sample: `queries` queries each attending to `keys` keys per head.

    Full attention has queries = keys = s; Swin's windows have queries = windows·w², keys = w². A causal
    mask leaves half the query–key pairs to compute for a kernel that skips masked blocks (flash).
    Tensor parallelism splits the heads. Context parallelism splits the queries and exchanges the keys and values
    (`kv_heads` of them per token; 0: one per query head).
    """

    heads: int
    head_dim: int
    queries: int
    keys: int
    causal: bool = False
    value_dim: int = 0  # per-head width of the values when it differs from the queries' and keys' (MLA)
    kv_heads: int = 0  # key/value heads (GQA: fewer than the query heads); 0: as many as `heads`


@dataclass(frozen=True)
class Elementwise:
    """A memory-bound operator over `elems` elements of one sample (16-bit activations).

    tp_sharded: the tensor lives inside a tensor-parallel region (split by tp); otherwise it is replicated
    over tp, unless sequence parallelism splits it along the sequence.
    """

    kind: str
    elems: float
    tp_sharded: bool = False
