"""benchmarks/split_backward_gpu.py, which a GPU session runs: small on CPU it times each pass, and without CUDA its
default refuses in one line instead of running an 8B block on the CPU."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "split_backward_gpu.py"


def test_the_passes_are_timed_and_the_model_share_is_a_share(benchmark_module):
    bench = benchmark_module("split_backward_gpu")
    t = bench.measure("tiny-llama", 32, 1, 2, torch.device("cpu"), torch.float32)
    assert set(t) == {"forward", "whole", "input", "weight"} and min(t.values()) > 0
    assert 0 < bench.predicted_share("tiny-llama", 32, 1) < 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_default_device_is_refused_in_one_line():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "no CUDA device" in proc.stderr
