import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, check: bool = True):
    """Run `uniap` as a user would (a subprocess), so exit codes and stderr are the real ones."""
    proc = subprocess.run([sys.executable, "-m", "uniap.cli", *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"uniap {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_json():
    def call(*args: str):
        proc = run_cli(*args, "--format", "json")
        return json.loads(proc.stdout)
    return call


def load_benchmark(name: str):
    """A script of benchmarks/ as a module, so a test checks what the benchmark itself prints."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def benchmark_module():
    return load_benchmark
