import json
import subprocess
import sys

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
