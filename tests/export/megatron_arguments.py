"""Megatron-LM's own argument code run on an exported launch script: `python megatron_arguments.py SCRIPT` with a
Megatron-LM checkout on PYTHONPATH prints, as JSON, what `parse_args`, `validate_args` (on a Hopper device, before
Blackwell) and `core_transformer_config_from_args` (TransformerConfig.__post_init__) made of its flags, or
{"error": ...} where they refuse them; {"unavailable": ...} when that checkout cannot be imported here. A test
helper (test_engine_parsers.py), run in its own process: it sets sys.argv and the environment as a launch would."""

import json
import os
import shlex
import sys
import typing
import warnings

EXTRA = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1024", "--mock-data", "--train-iters", "10",
         "--lr", "1e-4"]
"""The data, tokenizer and optimizer flags the script leaves to its user ("$@")."""


def main(path: str) -> dict:
    warnings.filterwarnings("ignore")
    if not hasattr(typing, "override"):  # Megatron-LM needs Python 3.12's typing.override (a no-op decorator)
        typing.override = lambda f: f
    try:
        import megatron.training.arguments as arguments
    except Exception as exc:  # noqa: BLE001 - anything missing here means: not checkable on this machine
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    words = shlex.split(open(path).read().replace("\\\n", " "), comments=True)
    start = words.index("torchrun")
    launch = words[start + 1:words.index("pretrain_gpt.py")]
    world = int(launch[launch.index("--nnodes") + 1]) * int(launch[launch.index("--nproc-per-node") + 1])
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(w.split("=", 1) for i, w in enumerate(words[:start]) if i and words[i - 1] == "export")
    sys.argv = ["pretrain_gpt.py"] + [w for w in words[words.index("pretrain_gpt.py") + 1:] if w != "$@"] + EXTRA
    try:
        args = arguments.parse_args(ignore_unknown_args=False)
        args.world_size, args.rank = world, 0
        arguments.get_device_arch_version = lambda: 9  # Hopper: where the environment rule applies
        arguments.validate_args(args)
        args.apply_rope_fusion = False  # Transformer Engine's fused RoPE kernel is not installed here
        config = arguments.core_transformer_config_from_args(args)
    except (AssertionError, ValueError, SystemExit) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"world": args.world_size, "dp": args.data_parallel_size, "tp": args.tensor_model_parallel_size,
            "cp": args.context_parallel_size, "pp": args.pipeline_model_parallel_size,
            "recompute_granularity": config.recompute_granularity, "recompute_method": config.recompute_method,
            "recompute_num_layers": config.recompute_num_layers, "recompute_modules": config.recompute_modules,
            "fp8": config.fp8, "fp8_recipe": str(config.fp8_recipe), "fp8_amax_history_len": config.fp8_amax_history_len,
            "fp8_amax_compute_algo": config.fp8_amax_compute_algo, "bf16": args.bf16,
            "distributed_optimizer": args.use_distributed_optimizer, "sequence_parallel": args.sequence_parallel}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
