"""Parameter counts of the stored Hugging Face configs as transformers builds them (the reference the
spec tests pin). Needs `transformers` (not a project dependency): run it in a private venv, e.g.

    python3 -m venv .venv-ref && .venv-ref/bin/pip install torch==2.13.0 transformers
    .venv-ref/bin/python benchmarks/hf_reference_counts.py

Models are built on the meta device (no memory, no weights). Tied embeddings count once, as
`parameters()` yields a shared tensor once. A multimodal config (Gemma 3 4B) is counted for its text
decoder only (`Gemma3ForCausalLM` of its `text_config`), which is what uniap plans.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
CAUSAL = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "phi3", "gpt_neox",
          "falcon", "olmo2", "starcoder2", "cohere", "gpt2")


def count(folder: Path) -> int:
    config = AutoConfig.from_pretrained(folder)
    if config.model_type == "gemma3":
        config = config.text_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    print(f"transformers {transformers.__version__}")
    for folder in sorted(DATA.iterdir()):
        path = folder / "config.json"
        if path.is_file() and json.loads(path.read_text()).get("model_type") in CAUSAL:
            print(f"{folder.name:24s} {count(folder):>16,d}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
