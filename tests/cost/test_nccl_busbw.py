"""Collective times against published nccl-tests bus bandwidths (benchmarks/data/nccl_tests.yaml)."""

import statistics


def test_large_messages_match_published_busbw(benchmark_module):
    bench = benchmark_module("nccl_busbw")
    rows = [r for r in bench.load_rows() if r["interconnect"] not in bench.SUSPECT and r["bytes"] >= bench.LARGE]
    assert {r["interconnect"] for r in rows} >= {"dgx-a100-nvlink", "dgx-h100-nvlink", "h100-ndr-ib"}
    errors = [abs(pred / r["busbw_gbps"] - 1) for r, pred in bench.results(rows)]
    assert max(errors) <= 0.30
    assert statistics.median(errors) <= 0.15


def test_multi_node_rings_are_as_wide_as_the_nics_of_a_node(benchmark_module):
    # 2 nodes × 8 H100 with one 400 Gb/s NIC each: ~360 GB/s for a 8 GiB all-reduce, not one NIC's 45
    bench = benchmark_module("nccl_busbw")
    row = {"interconnect": "h100-ndr-ib", "collective": "all_reduce", "gpus": 16, "nodes": 2, "bytes": 8 * 2**30}
    assert 300 < bench.predicted_busbw(row) <= 400
