"""Collective times against published nccl-tests bus bandwidths (benchmarks/data/nccl_tests.yaml)."""

import importlib.util
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "nccl_busbw.py"


def _bench():
    spec = importlib.util.spec_from_file_location("nccl_busbw", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_large_messages_match_published_busbw():
    bench = _bench()
    rows = [r for r in bench.load_rows() if r["interconnect"] not in bench.SUSPECT and r["bytes"] >= bench.LARGE]
    assert {r["interconnect"] for r in rows} >= {"dgx-a100-nvlink", "dgx-h100-nvlink", "h100-ndr-ib"}
    errors = [abs(pred / r["busbw_gbps"] - 1) for r, pred in bench.results(rows)]
    assert max(errors) <= 0.30
    assert statistics.median(errors) <= 0.15


def test_multi_node_rings_are_as_wide_as_the_nics_of_a_node():
    # 2 nodes × 8 H100 with one 400 Gb/s NIC each: ~360 GB/s for a 8 GiB all-reduce, not one NIC's 45
    bench = _bench()
    row = {"interconnect": "h100-ndr-ib", "collective": "all_reduce", "gpus": 16, "nodes": 2, "bytes": 8 * 2**30}
    assert 300 < bench.predicted_busbw(row) <= 400
