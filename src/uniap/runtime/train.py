"""The training loop on every rank, its measurements, and the one-process `check` reference.

`train_job(job, ctx)` runs one `TrainingJob` inside an initialised process group and returns the result
dict on rank 0 (None elsewhere):

  steps               steps run in this invocation (a resumed run starts at `first_step`)
  losses              global mean loss of each step run (plus the MoE blocks' load-balancing losses)
  iteration_time_s    median wall time of a step after the first (warm-up) one; a step is timed
                      from a world barrier to the end of the optimizer step, max over ranks
  stage_time_s        per stage: median over its ranks of the rank's median per-step compute time
                      (forward + backward + loss of its micro-batches; see measure.py)
  peak_memory_bytes   per rank (see measure.py for what it counts on CPU); on CPU the saved activations are
                      metered on the first step only (same shapes as the rest), unless the job asks for every
                      step, so that the timed steps run without saved-tensor hooks
  check               {"max_rel_loss_diff", "max_rel_param_diff", "tolerance", "within_tolerance"}
                      against one-process training on the same data and seed in the plan's precision
                      (tolerances and why: precision.py), or None
  precision           the plan's precision, trained as precision.py says; loss_scale: fp16's final
                      loss scale and skipped steps (None otherwise)

Optimizer: SGD(lr, momentum=0.9) by default, or AdamW(lr, betas=(0.9, 0.999), eps=1e-8) with
optimizer="adamw"; weight decay 0, fp32; the reference uses the same. SGD is the default because it
makes the check sensitive: Adam is invariant to a per-parameter gradient scale (a gradient summed
where it should be averaged would go unseen) and turns gradients that are analytically zero
(GPT-2's key bias: softmax ignores a per-row constant) into full-size noise-driven updates. Relative differences: |loss − ref| / |ref| per step; per parameter
max|p − ref| / max(max|ref|, 1e-3) (gathered to full tensors), both maxed over steps/parameters.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from uniap.errors import UniapError
from uniap.models.decoder import build_model, configure_aux_losses, lm_loss, take_aux_losses, use_attention_kernel
from uniap.plans import Plan
from uniap.spec.model import architecture_id
from uniap.runtime import checkpoint as ckpt
from uniap.runtime import data as data_mod
from uniap.runtime.checks import RunShape, check_plan
from uniap.runtime.data_parallel import apply_data_parallel
from uniap.runtime.hf import build_hf_model, hf_chain, hf_config_of
from uniap.runtime.job import OPTIMIZERS, TrainingJob
from uniap.runtime.measure import meters_activations, peak_memory_bytes, reset_peak_memory, static_bytes
from uniap.runtime.parallel_model import ParallelModel
from uniap.runtime.precision import LossScaler, precision_of, single_rank_mesh

@dataclass
class Context:
    rank: int
    world: int
    device: torch.device


def make_optimizer(params, lr: float, kind: str = "sgd") -> torch.optim.Optimizer:
    """SGD with momentum 0.9 (default) or AdamW; fp32, weight decay 0, single-tensor (foreach=False) kernels,
    which accept a mix of plain and DTensor parameters."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=0.0, foreach=False)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=False)
    raise UniapError(f"unknown optimizer {kind!r} (choose from {', '.join(OPTIMIZERS)})")


def check_resumable(path, shape: RunShape, optimizer: str) -> None:
    """Refuse a checkpoint of another model (architecture or sequence length) or optimizer."""
    meta = ckpt.read_meta(path)
    if meta.get("arch") != architecture_id(shape.config, shape.seq_len):
        raise UniapError(f"checkpoint {path} was written for model {meta.get('model')!r} (another architecture "
                         f"or sequence length) and cannot be resumed with a plan for {shape.config.name!r}")
    if meta.get("optimizer", optimizer) != optimizer:
        raise UniapError(f"checkpoint {path} holds {meta['optimizer']} optimizer state; resume with "
                         f"optimizer={meta['optimizer']!r}")


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _after_warmup(xs: list[float]) -> list[float]:
    return xs[1:] if len(xs) > 1 else xs


def _full_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of this stage as a full CPU tensor (collective over the stage's meshes); a tied weight
    under both of its layers' names (the runtime holds a copy in each)."""
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = t.detach().float().cpu().clone()
    return out


def reference(shape: RunShape, steps: int, *, seed: int, lr: float, data: str | None,
              device: torch.device, optimizer: str = "sgd", one_rank: DeviceMesh | None = None,
              aux_loss_coef: float | None = None, impl: str = "uniap") -> tuple[list[float], dict[str, torch.Tensor]]:
    """One-process training on the same data and seed, in the plan's precision and attention kernel: losses per
    step (with the MoE blocks' load-balancing losses) and final parameters. Mixed precision needs `one_rank`, this
    rank's one-rank mesh: the whole model is `replicate`d over it with the runtime's casting (see precision.py).
    impl "transformers": the model is the transformers class, trained through its own forward."""
    precision = precision_of(shape.precision)
    if impl == "transformers":
        model = build_hf_model(hf_config_of(shape.plan), seed, shape.attention).to(device)
    else:
        model = build_model(shape.config, seed).to(device)
        use_attention_kernel(model, shape.attention)
        configure_aux_losses(model, aux_loss_coef)
    if precision.mixed:
        apply_data_parallel(model, one_rank, 0, precision.policy)
    scaler = LossScaler() if precision.scales_loss else None
    opt = make_optimizer(model.parameters(), lr, optimizer)
    losses = []
    for step in range(steps):
        x, y = data_mod.batch(step, shape.global_batch, shape.seq_len, shape.config.vocab, seed, data)
        logits = model(input_ids=x.to(device)).logits if impl == "transformers" else model(x.to(device))
        loss = lm_loss(logits, y.to(device))
        (loss if scaler is None else loss * scaler.scale).backward()
        if scaler is not None:
            scaler.unscale_or_skip(model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()) + take_aux_losses(model))
    return losses, _full_params(model)


PARAM_SCALE_FLOOR = 1e-3


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a − b| / max(max|b|, 1e-3): relative to the tensor's scale; tensors whose entries all stay
    below 1e-3 (e.g. GPT-2's key bias, whose gradient is analytically zero and numerically noise)
    are compared absolutely at that scale."""
    scale = max(b.abs().max().item(), PARAM_SCALE_FLOOR)
    return (a - b).abs().max().item() / scale


def train_job(job: TrainingJob, ctx: Context, after_step: Callable[[int], None] | None = None,
              before_step: Callable[[int], None] | None = None) -> dict | None:
    """Run `job` on this rank (see the module docstring). Hooks, outside the step's timing: before_step(step) on this
    rank before each step (the worker injects the tests' faults with it, `faults.py`); after_step(step) after each
    (benchmarks/runtime_overhead.py alternates plain torch's steps with ours)."""
    rank, world, device = ctx.rank, ctx.world, ctx.device
    plan = Plan.load(job.plan)
    shape = check_plan(plan, world, job.impl)
    steps, seed, lr, data, opt_kind = job.steps, job.seed, job.lr, job.data, job.optimizer
    ck_dir, ck_every = job.checkpoint_dir, job.checkpoint_every

    chain = hf_chain(shape, seed, device) if job.impl == "transformers" else None
    model = ParallelModel.build(shape, rank, device, seed, job.aux_loss_coef, chain)
    topo, built, runner = model.topo, model.built, model.runner
    optimizer = make_optimizer(built.module.parameters(), lr, opt_kind)

    first_step = 0
    resumed_from = None
    if job.resume:
        found = ckpt.latest(ck_dir)
        if found is not None:
            check_resumable(found[1], shape, opt_kind)
            ckpt.load(found[1], built.module, optimizer)
            first_step = resumed_from = found[0]
    reset_peak_memory(device)

    losses, step_times, compute_times, static_peak = [], [], [], 0
    for step in range(first_step, steps):
        x, y = data_mod.batch(step, shape.global_batch, shape.seq_len, shape.config.vocab, seed, data)
        x, y = x.to(device), y.to(device)
        if before_step is not None:
            before_step(step)
        metered = job.meter_every_step or step == first_step
        runner.meter.enabled = metered and meters_activations(device)
        dist.barrier()
        t0 = time.perf_counter()
        local = runner.step(x, y)
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
        if metered:
            static_peak = max(static_peak, static_bytes(built.module, optimizer))
        optimizer.zero_grad(set_to_none=True)
        compute_times.append(runner.timer.take())
        losses.append(model.global_loss(local))  # the head's share (one rank per tp group) and the MoE losses
        slowest = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        step_times.append(float(slowest.item()))
        if ck_every and (step + 1) % ck_every == 0:
            ckpt.save(ck_dir, step + 1, built.module, optimizer,
                      {"model": shape.config.name, "arch": architecture_id(shape.config, shape.seq_len), "seed": seed, "lr": lr, "data": data,
                       "optimizer": opt_kind,
                       "plan_pipeline": shape.plan.pipeline.to_json()})
        if after_step is not None:
            after_step(step)

    peak = peak_memory_bytes(device, static_peak, runner.meter)
    mine = {"rank": rank, "stage": topo.stage, "compute": _median(_after_warmup(compute_times)), "peak": peak}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)

    check = _check(job, shape, model, chain, ctx, losses, first_step) if job.check else None
    if rank != 0:
        return None
    return _result(job, shape, runner, ctx, losses, step_times, everyone, first_step, resumed_from, check)


def _check(job: TrainingJob, shape: RunShape, model: ParallelModel, chain, ctx: Context, losses: list[float],
           first_step: int) -> dict | None:
    """Rank 0's comparison with one-process training (see the module docstring); collective, None elsewhere."""
    rank, world, device = ctx.rank, ctx.world, ctx.device
    steps, seed, lr, data, opt_kind = job.steps, job.seed, job.lr, job.data, job.optimizer
    topo, built = model.topo, model.built
    result = None  # rank 0's
    mixed = precision_of(shape.precision).mixed
    one_rank = single_rank_mesh(rank, world, device.type) if mixed else None  # collective
    params = _full_params(built.module)
    if chain is not None:  # the reference is the transformers model, under its own names
        params = {chain.hf_name(k): v for k, v in params.items()}
    gathered: list = [None] * world if rank == 0 else None
    dist.gather_object(params if topo.position == 0 else None, gathered, dst=0)
    if rank == 0:
        full = {}
        for part in gathered:
            if part:
                full.update(part)
        ref_losses, ref_params = reference(shape, steps, seed=seed, lr=lr, data=data, device=device,
                                           optimizer=opt_kind, one_rank=one_rank,
                                           aux_loss_coef=job.aux_loss_coef, impl=job.impl)
        ref_losses = ref_losses[first_step:]
        if set(full) != set(ref_params):
            raise RuntimeError(f"parameter names differ from the reference: {sorted(set(full) ^ set(ref_params))[:5]}")
        diffs = {k: _rel(full[k], ref_params[k]) for k in ref_params}
        worst = max(diffs, key=diffs.get)
        loss_diff = max((abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)), default=0.0)
        tol = precision_of(shape.precision).check_tolerance
        result = {
            "max_rel_loss_diff": loss_diff,
            "max_rel_param_diff": diffs[worst],
            "worst_param": worst,
            "reference_losses": ref_losses,
            "tolerance": asdict(tol),
            "within_tolerance": bool(loss_diff <= tol.loss and diffs[worst] <= tol.params),
        }
    dist.barrier()
    return result


def _result(job: TrainingJob, shape: RunShape, runner, ctx: Context, losses: list[float], step_times: list[float],
            everyone: list[dict], first_step: int, resumed_from: int | None, check: dict | None) -> dict:
    """Rank 0's result dict (see the module docstring)."""
    world, device, opt_kind = ctx.world, ctx.device, job.optimizer
    stage_time = []
    for s in range(shape.pp):
        vals = [e["compute"] for e in everyone if e["stage"] == s and e["compute"] is not None]
        stage_time.append(_median(vals))
    return {
        "steps": len(losses),
        "first_step": first_step,
        "resumed_from": resumed_from,
        "losses": losses,
        "iteration_time_s": _median(_after_warmup(step_times)),
        "step_times_s": step_times,
        "stage_time_s": stage_time,
        "peak_memory_bytes": [e["peak"] for e in sorted(everyone, key=lambda e: e["rank"])],
        "check": check,
        "world_size": world,
        "device": device.type,
        "pipeline": {"degree": shape.pp, "micro_batches": shape.micro_batches, "schedule": shape.schedule,
                     "virtual_stages": shape.virtual_stages},
        "precision": shape.precision,
        "loss_scale": None if runner.scaler is None else {"final": runner.scaler.scale,
                                                          "skipped_steps": runner.scaler.skipped_steps},
        "optimizer": opt_kind,
        "impl": job.impl,
        "memory_method": ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
                          "params+grads+optimizer state (local shards) + peak saved activations"),
    }
