"""Solve time of the UniAP MILP against model depth L and pipeline degree P, folded vs unfolded.

The cost tables are synthetic but shaped like the real cost model's: a GPT-style model (embedding, L identical
blocks, head) on 128 devices (16 nodes × 8), strategies (dp, tp, zero, recompute) with dp·tp = 128/P, tp ≤ 8
inside a node (4 layout classes, 32 strategies), 1F1B with c = 16 micro-batches, 80 GB per device; every cost gets
±5 % noise per layer type so that ties are rare. Run:

    python benchmarks/solver_scaling.py            # full table (unfolded runs capped at --unfolded-limit s)
    python benchmarks/solver_scaling.py --quick    # small grid, a few seconds
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np

from uniap.solve.milp import solve
from uniap.solve.program import StageProgram

DEVICES, NODE = 128, 8
PEAK, INTRA_BW, INTER_BW = 300e12, 200e9, 25e9  # FLOP/s (bf16, dense), bytes/s
HIDDEN, SEQ, VOCAB, GLOBAL_BATCH, MICRO_BATCHES = 4096, 2048, 50304, 512, 16
CAPACITY = 80e9
BYTES = 2  # bf16 activations and weights


def strategies(devices: int) -> list[tuple[int, int, int, int]]:
    """(dp, tp, zero, recompute) with dp·tp = devices and tp inside one node."""
    return [(devices // tp, tp, zero, rc) for tp in (1, 2, 4, 8) if tp <= min(devices, NODE) and devices % tp == 0
            for zero in range(4) for rc in (0, 1)]


def _layer_costs(params, flops, act, tp_elems, strat, samples_per_micro, recomputable, noise):
    """(A, G, Ms, Ma, allowed) of one layer kind under one strategy (flops/act per sample)."""
    dp, tp, zero, rc = strat
    if samples_per_micro % dp or (rc and not recomputable):
        return 0.0, 0.0, 0.0, 0.0, False
    samples = samples_per_micro / dp
    eff = 0.55 - 0.03 * math.log2(tp)
    compute = flops * samples / tp / (PEAK * eff) * (4 / 3 if rc else 1.0)
    tp_comm = (3 if rc else 2) * 2 * (tp - 1) / tp * tp_elems * samples * BYTES / INTRA_BW if tp > 1 else 0.0
    dp_bw = INTER_BW if dp * tp > NODE else INTRA_BW
    shard_bytes = params / tp * BYTES
    per_micro = 0.0
    if zero >= 2:
        per_micro += (dp - 1) / dp * shard_bytes / dp_bw
    if zero >= 3:
        per_micro += 2 * (dp - 1) / dp * shard_bytes / dp_bw
    sync = 2 * (dp - 1) / dp * shard_bytes / dp_bw if zero <= 1 else ((dp - 1) / dp * shard_bytes / dp_bw
                                                                       if zero == 2 else 0.0)
    optimizer = 16 * params / tp / (dp if zero >= 1 else 1) / 1e12
    opt_state, grads, weights = 12 * params / tp, 2 * params / tp, 2 * params / tp
    Ms = weights / (dp if zero >= 3 else 1) + grads / (dp if zero >= 2 else 1) + opt_state / (dp if zero >= 1 else 1)
    Ma = samples * (2 * SEQ * HIDDEN * BYTES if rc else act / tp)
    A = (max(compute, per_micro) + tp_comm) * noise[0]
    return A, (sync + optimizer) * noise[1], Ms, Ma, True


def synthetic_program(blocks: int, stages: int, seed: int = 0) -> StageProgram:
    """Embedding + `blocks` identical transformer blocks + head, for P = `stages`."""
    rng = np.random.default_rng(seed)
    strats = strategies(DEVICES // stages)
    K, L = len(strats), blocks + 2
    micro = GLOBAL_BATCH // MICRO_BATCHES
    h, s = HIDDEN, SEQ
    kinds = {  # params, flops per sample (fwd+bwd), activation bytes per sample, tp all-reduce elements per sample
        "embed": (VOCAB * h, 6 * s * h, s * h * BYTES, s * h, False),
        "block": (12 * h * h, 72 * s * h * h + 12 * s * s * h, s * h * (34 + 5 * 32 * s / h), 2 * s * h, True),
        "head": (VOCAB * h, 6 * s * h * VOCAB, 4 * s * VOCAB, s * h, False),
    }
    rows = {}
    for kind, (params, flops, act, tp_elems, recomputable) in kinds.items():
        noise = rng.uniform(0.95, 1.05, (K, 2))
        rows[kind] = [_layer_costs(params, flops, act, tp_elems, st, micro, recomputable, noise[k])
                      for k, st in enumerate(strats)]
    layout = np.array([st[1] for st in strats])
    act_bytes = micro * s * h * BYTES
    shards = np.array([st[0] for st in strats])
    ratio = np.abs(1.0 / layout[:, None] - 1.0 / layout[None, :])
    reshard = ratio * act_bytes / INTRA_BW * 2
    send = (act_bytes / shards[:, None] + act_bytes / shards[None, :]) / INTER_BW * rng.uniform(0.95, 1.05)
    sequence = ["embed"] + ["block"] * blocks + ["head"]
    table = np.array([rows[kind] for kind in sequence])  # (L, K, 5)
    P = stages
    return StageProgram(
        A=table[..., 0], G=table[..., 1], Ms=table[..., 2], Ma=table[..., 3], allowed=table[..., 4].astype(bool),
        R=np.broadcast_to(reshard, (L - 1, K, K)).copy(), Rp=np.broadcast_to(send, (L - 1, K, K)).copy(),
        stages=P, micro_batches=MICRO_BATCHES,
        inflight=np.array([min(MICRO_BATCHES, P - i) for i in range(P)], dtype=float),
        memory_capacity=CAPACITY, group=np.array([0] + [1] * blocks + [2]))


MAX_UNFOLDED_COLUMNS = 400_000
"""Unfolded models beyond this many columns are not built (one binary per layer, stage and strategy, and an edge
variable per layer, stage and strategy pair: the Python model build alone would take minutes)."""


def _unfolded(program: StageProgram, limit: float) -> str:
    L, K, P = program.layers, program.strategies, program.stages
    columns = L * P * (K + 2 * K * K)
    if columns > MAX_UNFOLDED_COLUMNS:
        return f"too big ({columns / 1e6:.1f}M cols)"
    start = time.perf_counter()
    sol = solve(program, fold=False, time_limit=limit)
    elapsed = time.perf_counter() - start
    if sol is None:
        return "timeout"
    if not sol.optimal:
        return f"timeout (gap {sol.gap:.1%})"
    return f"{elapsed:.2f} s"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid (L ≤ 48, P ≤ 8), folded only")
    parser.add_argument("--unfolded-limit", type=float, default=20.0,
                        help="time limit of an unfolded solve in seconds (0: skip unfolded)")
    args = parser.parse_args(argv)
    blocks = [12, 24, 48] if args.quick else [12, 24, 48, 96, 128]
    stages = [1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16]
    unfolded = 0 if args.quick else args.unfolded_limit
    print(f"{'blocks':>6} {'P':>3} {'K':>3} {'folded':>12} {'unfolded':>22}  {'TPI':>10}")
    for n, P in itertools.product(blocks, stages):
        if P > n + 2:
            continue  # more stages than layers
        program = synthetic_program(n, P)
        start = time.perf_counter()
        sol = solve(program)
        folded = f"{time.perf_counter() - start:.2f} s" if sol and sol.optimal else "not optimal"
        other = _unfolded(program, unfolded) if unfolded else "skipped"
        objective = f"{sol.objective:.4f} s" if sol else "infeasible"
        print(f"{n:>6} {P:>3} {program.strategies:>3} {folded:>12} {other:>22}  {objective:>10}", flush=True)


if __name__ == "__main__":
    main()
