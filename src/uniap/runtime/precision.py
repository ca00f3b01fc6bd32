"""Mixed precision as the plan says: 16-bit compute; fp32 master weights, optimizer state and gradient reduction.

One mechanism for every layer: FSDP2's parameter casting (`MixedPrecisionPolicy(param_dtype=bf16 or fp16,
reduce_dtype=fp32)`). The layer's parameters stay fp32 — they are the master weights the optimizer steps and the
checkpoints hold. Forward casts them (the gathered ones under ZeRO) and the layer's floating inputs to the 16-bit
type, so every operator of the layer computes in it; backward's 16-bit gradients are cast to fp32 before they are
reduced over dp and land on the fp32 parameters.
- ZeRO 1–3: `fully_shard` with the policy; ZeRO-0: `replicate` with the policy (`data_parallel.py`).
- Layers without data parallelism (tp only, or one rank) are `replicate`d over a one-rank mesh (the size-1 dp
  dimension of their (1, tp) mesh, or `single_rank_mesh`): the same casting, and no communication.
- The one-process `--check` reference is the whole model under `replicate` over rank 0's one-rank mesh: the same
  casts, the same 16-bit operators.
Autocast is not used: it keeps the operators of its fp32 list (norms, softmax) in fp32 and casts weights on every
use, so it would compute differently from the FSDP-wrapped layers. The loss is taken in fp32 (`lm_loss` upcasts the
logits).

`--check` tolerances (relative, as train.py measures them), by precision. fp32: 1e-5 — the same operations in
another order (reductions over dp, tp and micro-batches). 16-bit: the run and the reference compute the same
operators in the same dtypes, but on other splits of the batch (dp, micro-batches) and of the matrices (tp), and
the run reduces gradients over dp and micro-batches in fp32 where the reference sums inside one 16-bit product, so
each 16-bit result may round differently, by up to the unit roundoff u = 2^-8 (bf16, 8 significant bits) or 2^-11
(fp16, 11). The loss is an fp32 mean over the batch's tokens of such values, their roundings largely cancel: one u
bounds it (measured on the tiny models: 3e-5 bf16, 4e-6 fp16). A parameter after a few SGD steps carries its
gradients' rounding through momentum; a tensor that starts at zero (biases; compared at the 1e-3 floor) is nothing
but those updates, so its relative error is its gradients': a gradient passes a few 16-bit roundings (the output
gradient, the product's result), measured at most 4.1 u (bf16, 1.6e-2) and 5.3 u (fp16, 2.6e-3); the tolerance is
8 u. A wrong gradient — a reduction missed, a factor of the dp degree — moves parameters by O(1) and still fails.

fp16 adds dynamic loss scaling (`LossScaler`, GradScaler's schedule): the loss is multiplied by the scale before
backward; after backward the gradients are divided by it (a power of two: exact) unless some rank holds a non-finite
gradient, in which case the step is skipped (gradients dropped: SGD and AdamW leave parameters without a gradient
untouched) and the scale halved; after `growth_interval` clean steps it doubles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from uniap.errors import UniapError
from uniap.models.decoder import local_tensor
from uniap.runtime.mesh import new_groups

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class CheckTolerance:
    """What `--check` accepts (see the module docstring)."""

    loss: float  # largest relative difference of a step's loss from the reference's
    params: float  # largest relative difference of a final parameter from the reference's


UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
CHECK_TOLERANCE = {"fp32": CheckTolerance(loss=1e-5, params=1e-5),
                   **{name: CheckTolerance(loss=u, params=8 * u) for name, u in UNIT_ROUNDOFF.items()}}


@dataclass(frozen=True)
class Precision:
    """How a run computes."""

    name: str  # "fp32", "bf16" or "fp16" (the plan's workload precision)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of activations and of the operators' inputs."""
        return DTYPES[self.name]

    @property
    def mixed(self) -> bool:
        return self.name != "fp32"

    @property
    def policy(self) -> MixedPrecisionPolicy | None:
        """FSDP2's policy for a mixed run (fp32 gradient reduction), None in fp32."""
        if not self.mixed:
            return None
        return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)

    @property
    def check_tolerance(self) -> CheckTolerance:
        return CHECK_TOLERANCE[self.name]

    @property
    def scales_loss(self) -> bool:
        return self.name == "fp16"


def precision_of(name: str) -> Precision:
    """The plan's precision as the runtime computes it; fp8 is refused: its GEMMs need fp8 tensor cores (H100
    class, through torchao or Transformer Engine), which CPUs lack and this runtime does not drive."""
    if name == "fp8":
        raise UniapError("precision fp8 is not supported by `uniap run`: it has no fp8 GEMMs (CPUs have none); "
                         "plan in bf16 to run it")
    if name not in DTYPES:
        raise UniapError(f"unknown precision {name!r} (choose from {', '.join(DTYPES)})")
    return Precision(name)


FP32 = Precision("fp32")


def single_rank_mesh(rank: int, world: int, device_type: str) -> DeviceMesh:
    """This rank's one-rank ("dp",) mesh. Collective: every rank creates every rank's group, in rank order."""
    mine = new_groups([[r] for r in range(world)], rank)
    return DeviceMesh.from_group(mine, device_type, mesh_dim_names=("dp",))


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16, with torch.amp.GradScaler's defaults (start 2^16, ×0.5 on overflow, ×2
    after 2000 clean steps). `group`: the ranks that skip a step together (None: this process alone)."""

    group: object = None
    scale: float = 2.0 ** 16
    growth_interval: int = 2000
    clean_steps: int = 0  # steps since the last overflow or growth
    skipped_steps: int = 0

    @torch.no_grad()
    def unscale_or_skip(self, params) -> bool:
        """Divide the gradients by the scale and return True, or — when any rank has a non-finite gradient —
        drop them (the optimizer then skips the step), halve the scale and return False."""
        params = [p for p in params if p.grad is not None]
        bad = any(not bool(torch.isfinite(local_tensor(p.grad)).all()) for p in params)
        device = params[0].grad.device if params else torch.device("cpu")
        flag = torch.tensor([1.0 if bad else 0.0], device=device)
        if self.group is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if flag.item() > 0:
            for p in params:
                p.grad = None
            self.scale /= 2.0
            self.clean_steps = 0
            self.skipped_steps += 1
            return False
        for p in params:
            local_tensor(p.grad).mul_(1.0 / self.scale)
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= 2.0
            self.clean_steps = 0
        return True
