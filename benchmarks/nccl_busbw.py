"""Bus bandwidth per message size: the cost model's collectives against published nccl-tests results.

benchmarks/data/nccl_tests.yaml holds nccl-tests outputs (size → busbw) for one DGX/HGX A100 and H100 node and
for multi-node H100 over 8 × 400 Gb/s InfiniBand, each row with its source. For every row the cost model times
the same collective over the same ranks (cost.comm with the link cost.tables chooses for that group) and
reports busbw = bus factor · bytes / time, as nccl-tests does.

    python benchmarks/nccl_busbw.py      # one table; exit 1 if a large-message row misses by > --tolerance
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
          "h100-ndr-ib": "h100-80g"}
SUSPECT = ("a100-hdr-ib",)  # one source, probably not 8 × HDR per node (see the data file's notes)
LARGE = 128 * 2**20  # bandwidth-bound sizes: what the planner's gradient and parameter traffic looks like


def load_rows(path: Path = DATA) -> list[dict]:
    return yaml.safe_load(path.read_text())


def predicted_busbw(row: dict) -> float:
    """GB/s the cost model gives the row's collective (busbw, as nccl-tests normalises it)."""
    n, nodes = int(row["gpus"]), int(row["nodes"])
    cluster = load_cluster(f"{PRESET[row['interconnect']]}:{nodes}x{n // nodes}")
    link = stage_links(cluster, 1, [Strategy(dp=n, tp=1)]).stage  # all ranks, contiguous
    nbytes = float(row["bytes"])
    op = row["collective"]
    seconds = getattr(comm, op)(nbytes, n, link)
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return factor * nbytes / seconds / 1e9


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
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
