"""Parameter counts of the stored Hugging Face configs as transformers builds them (the reference the
spec tests pin). Needs `transformers` (not a project dependency): run it in a private venv, e.g.

    python3 -m venv .venv-ref && .venv-ref/bin/pip install torch==2.13.0 transformers
    .venv-ref/bin/python benchmarks/hf_reference_counts.py

Models are built on the meta device (no memory, no weights). Tied embeddings count once, as
`parameters()` yields a shared tensor once. A multimodal config (Gemma 3 4B) is counted for its text
decoder only (`Gemma3ForCausalLM` of its `text_config`), which is what uniap plans.

Mixtures of experts also print their ACTIVE parameters per token: the total less, in every MoE block, the
weights of the (E - k) routed experts a token is not sent to (modules named `experts`; transformers 5.24
fuses each block's experts into one tensor per matrix, E along the first dimension), next to uniap's
`ModelSpec.active_parameters` and the published figure. DeepSeek-V3 and gpt-oss publish theirs without the
input embedding table, so the row prints that variant too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from uniap.spec import load_model  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
CAUSAL = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "gpt_neox",
          "falcon", "olmo2", "starcoder2", "cohere", "gpt2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3",
          "gpt_oss")
# Published active parameters (billions) and whether the figure leaves out the input embedding table.
PUBLISHED_ACTIVE = {"mixtral-8x7b": (12.9, False), "qwen2-57b-a14b": (14, False), "qwen3-30b-a3b": (3.3, False),
                    "deepseek-v3": (36.6, True), "gpt-oss-20b": (3.61, True), "gpt-oss-120b": (5.13, True)}


def count(folder: Path) -> tuple[int, int, int]:
    """(total, active per token, input embedding) parameters as transformers builds the model."""
    config = AutoConfig.from_pretrained(folder)
    if config.model_type == "gemma3":
        config = config.text_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    k = getattr(config, "num_experts_per_tok", 0) or 0
    idle = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "experts" and k:
            weights = list(module.parameters())
            experts = weights[0].shape[0]
            idle += sum(w.numel() for w in weights) // experts * (experts - k)
    return total, total - idle, model.get_input_embeddings().weight.numel()


def main() -> None:
    print(f"transformers {transformers.__version__}")
    print(f"{'model':24s} {'total':>16s} {'active':>16s} {'uniap active':>16s} {'w/o embedding':>14s} published")
    for folder in sorted(DATA.iterdir()):
        path = folder / "config.json"
        if not (path.is_file() and json.loads(path.read_text()).get("model_type") in CAUSAL):
            continue
        total, active, embedding = count(folder)
        row = f"{folder.name:24s} {total:>16,d}"
        if folder.name in PUBLISHED_ACTIVE:
            published, no_embedding = PUBLISHED_ACTIVE[folder.name]
            ours = load_model(str(folder)).active_parameters
            row += f" {active:>16,d} {ours:>16,d} {(active - embedding) / 1e9:>13.2f}B {published}B" \
                   + (" (without the embedding)" if no_embedding else "")
        print(row)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
