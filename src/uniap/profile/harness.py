"""The measuring side of `uniap profile`: runs on every rank of a torchrun world (gloo on CPU, NCCL on CUDA).

For every stage size d (a divisor of the world size N, largest first) the world is cut into N/d groups of d
consecutive ranks, and *all groups measure the same thing at the same time* — every rank is busy, as in a
real run (CPU ranks share the cores; GPU ranks share nothing, so this costs nothing there). Inside a group
every intra-layer strategy dp × tp = d the runtime can run is applied to one layer of each distinct type of
the model (embed, block, head: one per LayerSpec signature) with the runtime's own code
(`runtime.parallelize.apply_strategy`), and timed at a few micro-batch sizes:

  time       forward and backward of the layer (its own tp collectives and dp gradient reduction included,
             exactly as the runtime does them every micro-batch) — `warmup` untimed repetitions, then `reps`
             timed ones, each started from a world barrier; per repetition the slowest rank counts; the
             median over repetitions is kept. Wall clock on CPU, CUDA events on GPU.
  memory     static bytes (parameters + gradients + optimizer state after a step, local shards: what
             `runtime.measure.static_bytes` counts) and activation bytes kept for backward per micro-batch
             (`runtime.measure.ActivationMeter`; on CUDA also the allocator's growth across the forward).
  optimizer  the optimizer step of the layer's local parameters (SGD momentum, the runtime's default).

Then the whole chain in one forward + backward without and with ZeRO-0's all-reduces (what they cost beside
the backward, as a step runs them), and α–β of all-reduce, all-gather, reduce-scatter (each group size > 1, all groups at once) and
point-to-point (rank r ↔ r + N/2, all pairs at once) at a few message sizes.

ZeRO-1 runs as ZeRO-2 in the runtime (FSDP2 has no separate mode), so it is not measured twice: the
assembled profile copies the figures and says so (`runs_as`). Sequence parallelism is not measured either
and gets the plain tp figures the same way — an approximation since the runtime runs it for real (sequence
slices in and out, all-gather and reduce-scatter, less activation memory; `runtime/tensor_parallel.py`).
Layers are measured in fp32.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from uniap.models.decoder import build_layer, check_supported, lm_loss, use_attention_kernel
from uniap.profile.items import LayerType, merge_measurements, work_items
from uniap.spec.families import build_layers
from uniap.runtime.measure import ActivationMeter, static_bytes
from uniap.runtime.mesh import new_groups
from uniap.runtime.parallelize import apply_strategy
from uniap.runtime.train import make_optimizer
from uniap.spec.cluster import DEVICE_TYPES
from uniap.spec.model import ModelConfig
from uniap.strategies import Strategy


CHAIN_REPS_PER_REP = 3
"""The chain's repetitions per `reps`: its figure prices every ZeRO-0 all-reduce, and a repetition costs well
under a second (demo model: ~0.4 s for the chain without and with its all-reduces)."""


class Clock:
    """Elapsed seconds of a region: CUDA events on the current stream on GPU, wall clock on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    @contextmanager
    def region(self, out: list):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            out.append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            out.append(time.perf_counter() - t0)

    def read(self, marks: list) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) / 1000.0 for s, e in marks]
        return list(marks)


class Harness:
    def __init__(self, config: ModelConfig, seq_len: int, world: int, rank: int, device: torch.device, *,
                 micro_batch_sizes: list[int], warmup: int, reps: int, seed: int = 0,
                 collective_sizes: list[int] | None = None, rep_seconds: float = 0.05):
        check_supported(config)
        self.config, self.seq_len, self.world, self.rank, self.device = config, seq_len, world, rank, device
        self.sizes = list(micro_batch_sizes)
        self.warmup, self.reps, self.seed = int(warmup), int(reps), int(seed)
        self.collective_sizes = list(collective_sizes or [16 << 10, 256 << 10, 1 << 20, 4 << 20])
        self.rep_seconds = float(rep_seconds)
        self.clock = Clock(device)
        # the attention kernel `uniap run` uses for plans on this kind of device: the cpu preset's engine (standard:
        # the math path, which keeps the scores), flash attention on GPUs
        self.attention = DEVICE_TYPES["cpu"].engine.attention if device.type == "cpu" else "flash"
        self._meshes: dict[tuple[int, int], DeviceMesh] = {}
        self._groups: dict[int, dist.ProcessGroup] = {}

    # -- groups ----------------------------------------------------------------------------------------
    def mesh(self, dp: int, tp: int) -> DeviceMesh:
        """This rank's (dp, tp) mesh inside its group of dp·tp consecutive ranks (every rank builds all)."""
        key = (dp, tp)
        if key not in self._meshes:
            grid = torch.arange(self.world, dtype=torch.int).reshape(self.world // (dp * tp), dp, tp)
            full = DeviceMesh(self.device.type, grid, mesh_dim_names=("group", "dp", "tp"))
            self._meshes[key] = full["dp", "tp"]
        return self._meshes[key]

    def group(self, n: int) -> dist.ProcessGroup:
        if n not in self._groups:
            self._groups[n] = new_groups([list(range(start, start + n)) for start in range(0, self.world, n)],
                                         self.rank)
        return self._groups[n]

    def _max(self, values: list[float]) -> list[float]:
        """Element-wise max over all ranks."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.cpu().tolist()

    # -- layers ------------------------------------------------------------------------------------------
    def _build(self, lt: LayerType, s: Strategy):
        layer = build_layer(self.config, lt.index, self.seed).to(self.device)
        use_attention_kernel(layer, self.attention)
        return apply_strategy(layer, s, self.mesh(s.dp, s.tp) if s.devices > 1 else None,
                              backward_follows=lt.kind in ("embedding", "head"))  # as the runtime applies them

    def _inputs(self, lt: LayerType, samples: int):
        gen = torch.Generator(device="cpu").manual_seed(self.seed * 7919 + samples)
        t, h, v = self.seq_len, self.config.hidden, self.config.vocab
        if lt.kind == "embedding":
            x = torch.randint(0, v, (samples, t), generator=gen).to(self.device)
        else:
            x = torch.randn((samples, t, h), generator=gen).to(self.device).requires_grad_(True)
        grad = None if lt.kind == "head" else torch.randn((samples, t, h), generator=gen).to(self.device)
        targets = torch.randint(0, v, (samples, t), generator=gen).to(self.device) if lt.kind == "head" else None
        return x, grad, targets

    def measure_layer(self, lt: LayerType, s: Strategy) -> dict:
        """Forward/backward time and memory of one layer type under one strategy at every micro-batch size
        (samples per device, i.e. per dp shard).

        A repetition is `inner` calls back to back (as layers run in a real step), enough to last about
        `rep_seconds`: on a CPU shared by several ranks a single call of a few ms is at the mercy of the
        scheduler's time slices; the per-call figure is the repetition's time / inner.
        """
        layer = self._build(lt, s)
        sync = getattr(layer, "gradient_sync", None)
        if sync is not None:  # ZeRO-0 reduces once per step, not per call: priced apart (profile.calibration)
            sync.enabled = False
        optimizer = make_optimizer(layer.parameters(), 1e-3, "sgd")
        meter = ActivationMeter(layer)
        rows = []
        for samples in self.sizes:
            x, grad, targets = self._inputs(lt, samples)
            act = [0]

            def call(marks_f: list, marks_b: list, key=None, x=x, grad=grad, targets=targets, act=act) -> None:
                """One forward and backward; metered (saved activations counted) when `key` is given, as the
                runtime meters its first step only and times the others without the meter."""
                with self.clock.region(marks_f), (meter.forward(key) if key is not None else nullcontext()):
                    out = layer(x)
                    if targets is not None:  # the head's loss belongs to it (the runtime meters it with the stage)
                        out = lm_loss(out, targets, targets.numel())
                if key is not None:
                    act[0] = max(act[0], meter.live.get(key, 0))
                with self.clock.region(marks_b):
                    if grad is None:
                        out.backward()
                    else:
                        out.backward(grad)
                if key is not None:
                    meter.backward_done(key)

            warm = []
            for rep in range(max(self.warmup, 1)):
                dist.barrier()
                with self.clock.region(warm):
                    call([], [], rep if rep == 0 else None)
            inner = self._inner(self.clock.read(warm)[-1])
            fwd, bwd, total = [], [], []
            for rep in range(self.reps):
                fm, bm, tm = [], [], []
                dist.barrier()
                with self.clock.region(tm):
                    for _ in range(inner):
                        call(fm, bm)
                fwd.append(sum(self.clock.read(fm)) / inner)
                bwd.append(sum(self.clock.read(bm)) / inner)
                total.append(self.clock.read(tm)[0] / inner)
            if self.device.type == "cuda":  # the allocator's view: growth across one forward (saved tensors + output)
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated(self.device)
                with meter.forward("cuda"):
                    out = layer(x)
                    if targets is not None:
                        out = lm_loss(out, targets, targets.numel())
                act[0] = max(act[0], torch.cuda.memory_allocated(self.device) - before)
                del out
                meter.backward_done("cuda")
            got = self._max(total + fwd + bwd + [float(act[0]), float(inner)])
            r = self.reps
            rows.append({"samples": samples, "fwd_bwd_s": got[:r], "fwd_s": got[r:2 * r], "bwd_s": got[2 * r:3 * r],
                         "act_bytes": int(got[-2]), "inner": int(got[-1])})
        opt = self._repeated(optimizer.step)
        static = self._max([float(static_bytes(layer, optimizer))])[0]
        optimizer.zero_grad(set_to_none=True)
        return {"rows": rows, "optimizer_s": opt, "static_bytes": int(static)}

    def _repeated(self, call) -> list[float]:
        """Seconds per call of `call`, per repetition (slowest rank): `_warm`, then `reps` repetitions."""
        inner = self._warm(call)
        return self._max([self._timed(call, inner) for _ in range(self.reps)])

    def _warm(self, call) -> int:
        """Warm-up calls of `call`; the calls per repetition that make one last about `rep_seconds`."""
        warm = []
        for _ in range(max(self.warmup, 1)):
            dist.barrier()
            with self.clock.region(warm):
                call()
        return self._inner(self.clock.read(warm)[-1])

    def _timed(self, call, inner: int) -> float:
        """Seconds per call of one repetition on this rank: `inner` calls back to back after a world barrier."""
        marks = []
        dist.barrier()
        with self.clock.region(marks):
            for _ in range(inner):
                call()
        return self.clock.read(marks)[0] / inner

    def _inner(self, seconds: float) -> int:
        """Calls per repetition so that one lasts about `rep_seconds` (the same count on every rank)."""
        want = 1 if seconds <= 0 else min(64, max(1, int(round(self.rep_seconds / seconds))))
        return int(self._max([float(want)])[0])

    # -- pipeline -------------------------------------------------------------------------------------------
    def measure_pipeline(self, stages: int) -> dict:
        """Per-slot cost of the pipeline machinery (`torch.distributed.pipelining`, 1F1B, point-to-point of the
        model's activation at the middle micro-batch size between the same positions of consecutive stages, as
        the runtime does) with a stand-in stage that computes almost nothing: step time / (c + P − 1), minus the
        stand-in's own forward + backward."""
        from torch import nn
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        d = self.world // stages
        stage, pos = self.rank // d, self.rank % d
        mine = new_groups([[s * d + p for s in range(stages)] for p in range(d)], self.rank)
        samples = self.sizes[len(self.sizes) // 2]
        c = 2 * stages
        h, t = self.config.hidden, self.seq_len
        module = nn.Linear(h, 8).to(self.device)
        stand_in = nn.Sequential(module, nn.Linear(8, h)).to(self.device)
        inputs = torch.zeros((samples, t, h), device=self.device, requires_grad=stage > 0)
        outputs = torch.zeros((samples, t, h), device=self.device, requires_grad=True)
        pstage = PipelineStage(stand_in, stage, stages, self.device, input_args=inputs, output_args=outputs, group=mine)
        members = [s * d + pos for s in range(stages)]
        order = sorted(members)
        pstage.stage_index_to_group_rank = {s: order.index(r) for s, r in enumerate(members)}
        schedule = Schedule1F1B(pstage, n_microbatches=c, loss_fn=lambda y, tgt: (y - tgt).pow(2).sum(),
                                scale_grads=False)
        x = torch.randn((samples * c, t, h), device=self.device)
        target = torch.randn((samples * c, t, h), device=self.device)

        def step() -> None:
            if stage == 0:
                schedule.step(x)
            elif stage == stages - 1:
                schedule.step(target=target)
            else:
                schedule.step()

        steps = []
        for rep in range(self.warmup + self.reps):
            marks = []
            dist.barrier()
            with self.clock.region(marks):
                step()
            if rep >= self.warmup:
                steps.append(self.clock.read(marks)[0])
        y = torch.randn((samples, t, h), device=self.device, requires_grad=True)
        own = []
        for _ in range(self.reps):
            marks = []
            with self.clock.region(marks):
                stand_in(y).sum().backward()
            own.append(self.clock.read(marks)[0])
        got = self._max(steps + [sorted(own)[len(own) // 2]])
        return {"stages": stages, "micro_batches": c, "samples": samples, "step_s": got[:-1], "stand_in_s": got[-1]}

    # -- the whole chain -------------------------------------------------------------------------------
    def measure_chain(self) -> dict:
        """Forward + backward of the whole chain, every layer dp over all ranks (ZeRO-0), without its
        all-reduces and with them, as a step runs them: each layer's beside the backward of the layers before
        it. The two are timed back to back in every repetition, so a slow spell of the machine touches both
        and their difference, what calibration uses, survives it."""
        s = Strategy(dp=self.world, tp=1, zero=0, recompute=False)
        n_layers = len(build_layers(self.config, self.seq_len).layers)
        chain = []
        for u in range(n_layers):
            layer = build_layer(self.config, u, self.seed).to(self.device)
            use_attention_kernel(layer, self.attention)
            layer = apply_strategy(layer, s, self.mesh(s.dp, 1) if s.devices > 1 else None)
            sync = getattr(layer, "gradient_sync", None)
            if sync is not None:
                sync.enabled = False
            chain.append(layer)
        samples = self.sizes[len(self.sizes) // 2]
        gen = torch.Generator(device="cpu").manual_seed(self.seed * 7919 + samples)
        tokens = torch.randint(0, self.config.vocab, (samples, self.seq_len), generator=gen).to(self.device)
        targets = torch.randint(0, self.config.vocab, (samples, self.seq_len), generator=gen).to(self.device)
        syncs = [layer.gradient_sync for layer in chain if getattr(layer, "gradient_sync", None) is not None]

        def whole() -> None:
            out = tokens
            for layer in chain[:-1]:
                out = layer(out)
            lm_loss(chain[-1](out), targets, targets.numel()).backward()

        def synced() -> None:  # one step of one micro-batch: every layer all-reduces as its backward ends
            for sync in syncs:
                sync.set_backwards_per_step(1)
                sync.enabled = True
            whole()
            for sync in syncs:
                sync.finish()
                sync.enabled = False

        calls = [whole, synced]
        inner = [self._warm(call) for call in calls]
        pairs = [self._timed(call, n) for _ in range(CHAIN_REPS_PER_REP * self.reps) for call, n in zip(calls, inner)]
        got = self._max(pairs)
        for layer in chain:
            layer.zero_grad(set_to_none=True)
        return {"strategy": s.to_json(), "samples": samples, "chain_s": got[0::2],
                "synced_s": got[1::2] if syncs else got[0::2]}

    # -- collectives -------------------------------------------------------------------------------------
    def measure_collective(self, op: str, n: int) -> dict:
        rows = []
        group = self.group(n) if op != "p2p" else None
        half = self.world // 2
        for nbytes in self.collective_sizes:
            elems = max(n, (nbytes // 4) // n * n)
            full = torch.ones(elems, dtype=torch.float32, device=self.device)
            part = torch.ones(elems // n, dtype=torch.float32, device=self.device)

            def once(full=full, part=part) -> None:
                if op == "all_reduce":
                    dist.all_reduce(full, group=group)
                elif op == "all_gather":
                    dist.all_gather_into_tensor(full, part, group=group)
                elif op == "reduce_scatter":
                    dist.reduce_scatter_tensor(part, full, group=group)
                elif self.rank < half:  # p2p: the first half sends to the second half, all pairs at once
                    dist.send(full, self.rank + half)
                elif self.rank < 2 * half:
                    dist.recv(full, self.rank - half)

            rows.append({"bytes": elems * 4, "times_s": self._repeated(once)})
        return {"rows": rows}


def run_profile(spec: dict, rank: int, world: int, device: torch.device, progress=None) -> dict | None:
    """Measure everything `work_items` lists; rank 0 returns the raw measurements (others None)."""
    config = ModelConfig(**spec["config"])
    seq_len = int(spec["seq_len"])
    torch.manual_seed(int(spec.get("seed", 0)))
    h = Harness(config, seq_len, world, rank, device, micro_batch_sizes=spec["micro_batch_sizes"],
                warmup=spec["warmup"], reps=spec["reps"], seed=int(spec.get("seed", 0)),
                collective_sizes=spec.get("collective_sizes"), rep_seconds=float(spec.get("rep_seconds", 0.05)))
    items = work_items(config, seq_len, world, spec.get("max_tp"))
    passes = max(1, int(spec.get("passes", 1)))
    got: list = [None] * len(items)
    started = time.perf_counter()
    total = passes * len(items)
    # Several passes over everything, each with a share of the repetitions: a slow spell of the machine (other
    # processes, the scheduler) then touches a little of every figure instead of all of a few.
    for p in range(passes):
        for i, item in enumerate(items):
            if progress is not None and rank == 0:
                progress(p * len(items) + i, total, _describe(item) + (f" (pass {p + 1}/{passes})" if passes > 1 else ""))
            if item[0] == "layer":
                new = h.measure_layer(item[2], item[3])
            elif item[0] == "pipeline":
                new = h.measure_pipeline(item[1])
            elif item[0] == "chain":
                new = h.measure_chain()
            else:
                new = h.measure_collective(item[1], item[2])
            got[i] = new if got[i] is None else merge_measurements(got[i], new)
    if progress is not None and rank == 0:
        progress(total, total, "done")
    if rank != 0:
        return None
    layers, collectives, pipeline, chain = [], [], [], None
    for item, res in zip(items, got):
        if item[0] == "pipeline":
            pipeline.append(res)
        elif item[0] == "chain":
            chain = res
        elif item[0] == "layer":
            _, d, lt, s = item
            layers.append({"d": d, "kind": lt.kind, "index": lt.index, "names": list(lt.names),
                           "strategy": s.to_json(), **res})
        else:
            collectives.append({"op": item[1], "n": item[2], **res})
    return {"layers": layers, "collectives": collectives, "pipeline": pipeline, "chain": chain,
            "seconds": time.perf_counter() - started,
            "passes": passes, "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def _describe(item: tuple) -> str:
    if item[0] == "layer":
        _, d, lt, s = item
        return f"{lt.kind} on {d} rank{'s' if d > 1 else ''}: {s.label()}"
    if item[0] == "pipeline":
        return f"pipeline machinery over {item[1]} stages"
    if item[0] == "chain":
        return "the whole chain without and with ZeRO-0's all-reduces"
    _, op, n = item
    return f"{op} over {n} ranks"
