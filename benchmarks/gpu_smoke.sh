#!/usr/bin/env bash
# One short bf16 plan on one GPU: measured step time and peak memory next to the plan's prediction.
#
#   bash benchmarks/gpu_smoke.sh [OUT_DIR]        (needs CUDA; refuses in one line without it)
#
# Model: a ~0.3 B Llama-style decoder (hidden 1024, 16 layers, vocab 32000, untied embeddings), written as a
# Hugging Face config.json; batch 8 × 1024 tokens. Plan: `uniap estimate` of the single-device layout under
# bf16 on CLUSTER (default h100-80g:1x1, the nearest preset to one H100/H200); run: `uniap run --nproc 1`,
# STEPS steps (the first is a warm-up). The run reports the precision it actually trained in.
set -euo pipefail

PY=${PYTHON:-python}
OUT=${1:-out/gpu_smoke}
CLUSTER=${CLUSTER:-h100-80g:1x1}
STEPS=${STEPS:-6}

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_smoke: no CUDA device visible (torch.cuda.is_available() is False); run it on a GPU machine" >&2
    exit 2
fi

mkdir -p "$OUT"
cat > "$OUT/config.json" <<'JSON'
{"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
 "num_key_value_heads": 16, "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 2048,
 "tie_word_embeddings": false}
JSON

"$PY" -m uniap.cli estimate --model "$OUT/config.json" --cluster "$CLUSTER" --global-batch 8 --seq-len 1024 \
    --precision bf16 --format json > "$OUT/plan.json"
"$PY" -m uniap.cli run --plan "$OUT/plan.json" --nproc 1 --steps "$STEPS" --format json > "$OUT/run.json"

"$PY" - "$OUT/plan.json" "$OUT/run.json" <<'PYCODE'
import json, sys
plan, run = (json.load(open(p)) for p in sys.argv[1:3])
pred = plan["predicted"]
print(f"gpu_smoke: {plan['model']['name']} on {plan['cluster']['name']}, plan precision "
      f"{plan['workload']['precision']}, trained in {run['precision']} on {run['device']}")
print(f"{'':14}{'predicted':>12}{'measured':>12}")
print(f"{'step time':14}{pred['iteration_time_s'] * 1e3:>10.1f} ms{run['iteration_time_s'] * 1e3:>10.1f} ms")
print(f"{'peak memory':14}{max(pred['peak_memory_bytes']) / 2**30:>9.2f} GiB"
      f"{max(run['peak_memory_bytes']) / 2**30:>9.2f} GiB  ({run['memory_method']})")
PYCODE
