"""Bus bandwidth per message size: the cost model's collectives against published nccl-tests results.

benchmarks/data/nccl_tests.yaml holds nccl-tests outputs (size → busbw) for one DGX/HGX A100 and H100 node and
for multi-node H100 over 8 × 400 Gb/s InfiniBand, each row with its source. For every row the cost model times
the same collective over the same ranks (cost.comm with the link cost.tables chooses for that group) and
reports busbw = bus factor · bytes / time, as nccl-tests does.

The all-to-all rows (nccl-tests alltoall_perf, and DeepEP's MoE dispatch/combine on H800) are costed the way the
cost model prices an expert exchange — cost.comm.all_to_all over the ep group's link from cost.tables — and printed
in a second table beside the ring link's figure; they are reported, not gated on.

    python benchmarks/nccl_busbw.py      # both tables; exit 1 if a large-message ring row misses by > --tolerance
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from uniap.cost import comm
from uniap.cost.tables import stage_links
from uniap.spec.cluster import load_cluster
from uniap.strategies import Strategy

DATA = Path(__file__).parent / "data" / "nccl_tests.yaml"
PRESET = {"dgx-a100-nvlink": "a100-80g", "a100-hdr-ib": "a100-80g", "dgx-h100-nvlink": "h100-80g",
          "h100-ndr-ib": "h100-80g", "h800-nvlink": "h800-80g", "h800-ndr-ib": "h800-80g"}
RING = ("all_reduce", "all_gather", "reduce_scatter")  # the collectives NCCL runs as rings (checked and gated)
ALL_TO_ALL = ("all_to_all", "ep_dispatch", "ep_combine")  # point-to-point exchanges (reported)
SUSPECT = ("a100-hdr-ib",)  # one source, probably not 8 × HDR per node (see the data file's notes)
LARGE = 128 * 2**20  # bandwidth-bound sizes: what the planner's gradient and parameter traffic looks like


def load_rows(path: Path = DATA) -> list[dict]:
    """The ring-collective rows (all-reduce, all-gather, reduce-scatter)."""
    return [r for r in yaml.safe_load(path.read_text()) if r["collective"] in RING]


def load_all_to_all(path: Path = DATA) -> list[dict]:
    """The all-to-all rows: nccl-tests alltoall_perf and DeepEP dispatch/combine."""
    return [r for r in yaml.safe_load(path.read_text()) if r["collective"] in ALL_TO_ALL]


def _cluster_and_link(row: dict):
    n, nodes = int(row["gpus"]), int(row["nodes"])
    cluster = load_cluster(f"{PRESET[row['interconnect']]}:{nodes}x{n // nodes}")
    return cluster, stage_links(cluster, 1, [Strategy(dp=n, tp=1)]).stage  # all ranks, contiguous


def predicted_busbw(row: dict) -> float:
    """GB/s the cost model gives the row's collective (busbw, as nccl-tests normalises it)."""
    n = int(row["gpus"])
    _, link = _cluster_and_link(row)
    nbytes = float(row["bytes"])
    op = row["collective"]
    seconds = getattr(comm, "all_to_all" if op in ALL_TO_ALL else op)(nbytes, n, link)
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return factor * nbytes / seconds / 1e9


def _bottleneck_share(row: dict) -> float:
    """Of the bytes a rank sends in an all-to-all, the share on the bottleneck link: the off-node peers' share
    across nodes (n − g of the n − 1 others, g ranks per node), all of it within one node."""
    n, nodes = int(row["gpus"]), int(row["nodes"])
    g = n // nodes
    return (n - g) / (n - 1) if nodes > 1 else 1.0


def all_to_all_prediction(row: dict) -> tuple[float, float]:
    """(the cost model's figure, the ring link's figure), in the row's own metric: nccl-tests busbw for all_to_all
    rows, DeepEP's bottleneck-link bandwidth for ep_dispatch/ep_combine rows. The cost model prices an expert
    exchange with comm.all_to_all over the ep group's link (cost.tables.stage_links(...).ep: off-node bytes through
    one NIC per GPU, as NVIDIA/nccl-tests#267 describes — "Alltoall cannot aggregate the bandwidth of multiple
    NICs"); the second figure uses the ring link of the same ranks (cost.tables._slowest, as the ring rows do), to
    show how far an all-to-all priced like a ring would be."""
    n = int(row["gpus"])
    cluster, ring = _cluster_and_link(row)
    ep_link = stage_links(cluster, 1, [Strategy(dp=n, tp=1, ep=n)]).ep[n, 1]
    nbytes = float(row["bytes"])
    seconds = [comm.all_to_all(nbytes, n, link) for link in (ep_link, ring)]
    if row["collective"] == "all_to_all":
        return tuple((n - 1) / n * nbytes / t / 1e9 for t in seconds)
    share = _bottleneck_share(row) * (n - 1) / n * nbytes
    return tuple(share / t / 1e9 for t in seconds)


def results(rows: list[dict]) -> list[tuple[dict, float]]:
    return [(row, predicted_busbw(row)) for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance", type=float, default=0.30)
    args = parser.parse_args()
    rows = sorted(load_rows(), key=lambda r: (r["interconnect"], r["collective"], r["gpus"], r["bytes"]))
    header = f"{'interconnect':<16} {'collective':<14} {'GPUs':>4} {'bytes':>11} {'published':>9} {'predicted':>9} " \
             f"{'error':>7}  source"
    print(header)
    print("-" * (len(header) + 20))
    large, small, worst = [], [], 0.0
    for row, pred in results(rows):
        err = pred / float(row["busbw_gbps"]) - 1
        mark = " (suspect source)" if row["interconnect"] in SUSPECT else ""
        print(f"{row['interconnect']:<16} {row['collective']:<14} {row['gpus']:>4} {row['bytes']:>11} "
              f"{row['busbw_gbps']:>9.1f} {pred:>9.1f} {err * 100:>+6.1f}%  {row['source'][:48]}{mark}")
        if row["interconnect"] in SUSPECT:
            continue
        (large if row["bytes"] >= LARGE else small).append(abs(err))
        if row["bytes"] >= LARGE:
            worst = max(worst, abs(err))
    print(f"\nmessages >= 128 MiB: {len(large)} rows, median |error| {statistics.median(large) * 100:.1f}%, "
          f"largest {worst * 100:.1f}% (target <= {args.tolerance * 100:.0f}%)")
    print(f"smaller messages: {len(small)} rows, median |error| {statistics.median(small) * 100:.1f}% "
          "(latency-bound; NCCL's LL protocols, trees and NVLS are not modelled)")
    print_all_to_all(load_all_to_all())
    return 0 if worst <= args.tolerance else 1


def print_all_to_all(rows: list[dict]) -> None:
    rows = sorted(rows, key=lambda r: (r["interconnect"], r["collective"], r["gpus"]))
    print("\nall-to-all (reported, not gated): published vs cost.comm.all_to_all over the ep group's link (the cost"
          " model's expert exchange) and over the same ranks' ring link")
    header = f"{'interconnect':<16} {'collective':<12} {'GPUs':>4} {'metric':<14} {'published':>9} {'model':>7} " \
             f"{'error':>7} {'ring link':>9} {'error':>7}  source"
    print(header)
    print("-" * (len(header) + 20))
    for row in rows:
        model, ring = all_to_all_prediction(row)
        published = float(row["busbw_gbps"] if row["collective"] == "all_to_all" else row["bottleneck_gbps"])
        metric = "busbw" if row["collective"] == "all_to_all" else f"{row['bottleneck']} bw"
        mark = " (approximate)" if row.get("approximate") else ""
        print(f"{row['interconnect']:<16} {row['collective']:<12} {row['gpus']:>4} {metric:<14} {published:>9.1f} "
              f"{model:>7.1f} {(model / published - 1) * 100:>+6.0f}% {ring:>9.1f} {(ring / published - 1) * 100:>+6.0f}%  "
              f"{row['source'][:40]}{mark}")


if __name__ == "__main__":
    sys.exit(main())
