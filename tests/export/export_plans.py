"""Plans with one block strategy and a chosen block split, built with the planner's own `make_plan`."""

from dataclasses import replace

import numpy as np

from uniap.estimate import make_plan
from uniap.spec import load_model
from uniap.spec.cluster import load_cluster
from uniap.spec.families import build_layers
from uniap.spec.model import ModelConfig
from uniap.spec.workload import Workload
from uniap.strategies import Strategy


def uniform_plan(model="tiny-llama", cluster="a100-80g:1x8", *, strategy: Strategy, chunk_blocks, micro_batches=4,
                 global_batch=32, schedule="1f1b", virtual_stages=1, precision="bf16"):
    """`strategy` on every block (without recompute on embedding and head), `chunk_blocks[j]` blocks on chunk j;
    `model` is a zoo name, a config.json path or a ModelConfig."""
    spec = build_layers(model, min(model.max_seq, 2048)) if isinstance(model, ModelConfig) else load_model(model)
    clus = load_cluster(cluster)
    chunks = []
    for j, count in enumerate(chunk_blocks):
        chunks += [j] * count
    stage_of = np.array([0] + chunks + [len(chunk_blocks) - 1])
    assert len(stage_of) == len(spec.layers)
    edge = replace(strategy, recompute="none")
    strategies = [strategy, edge] if edge != strategy else [strategy]
    strategy_of = np.zeros(len(spec.layers), dtype=int)
    strategy_of[[0, -1]] = len(strategies) - 1
    return make_plan(spec, clus, Workload(global_batch, spec.seq_len, precision), schedule, micro_batches, strategies,
                     stage_of, strategy_of, predicted={}, virtual_stages=virtual_stages)
