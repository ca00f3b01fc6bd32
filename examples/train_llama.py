"""Plan a Llama on 4 local ranks, train transformers' LlamaForCausalLM that way: torchrun --nproc-per-node 4 THIS"""
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM
import uniap
from uniap.views import describe

config = LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512, max_position_embeddings=64)
plan = uniap.plan(config, cluster="cpu:1x4", global_batch=8, seq_len=64)  # the ranks use rank 0's plan
model = uniap.parallelize(LlamaForCausalLM(config), plan)
optimizer = model.optimizer("adamw", lr=1e-3)
data = torch.randint(0, config.vocab_size, (10, 8, 65), generator=torch.Generator().manual_seed(0))
times = []
for step in range(10):
    start = time.perf_counter()
    loss = model.train_step(data[step, :, :-1], data[step, :, 1:])  # the global batch: every rank gets it whole
    optimizer.step()
    optimizer.zero_grad()
    times.append(time.perf_counter() - start)
if torch.distributed.get_rank() == 0:
    print(f"plan: {describe(model.plan)}\nloss {loss:.4f} after 10 steps; step time {statistics.median(times[1:]):.3f} s "
          f"measured, {model.plan.predicted['iteration_time_s']:.3f} s predicted")
