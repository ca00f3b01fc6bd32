"""Per-rank entry point of `uniap profile`: `python -m uniap.profile.worker SPEC.json OUT_DIR`.

Rank 0 writes OUT_DIR/progress.json while measuring (the launcher draws the progress bar from it) and
OUT_DIR/raw.json at the end. A failing rank writes OUT_DIR/error-rank<r>.json and exits non-zero at once
(the same protocol as `uniap.runtime.worker`, so the launcher reports it in one line).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


def _write(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m uniap.profile.worker SPEC.json OUT_DIR", file=sys.stderr)
        sys.exit(2)
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    try:
        from uniap.profile.harness import run_profile
        from uniap.runtime.worker import init_distributed

        ctx = init_distributed(float(spec.get("timeout_s", 120.0)))

        def progress(done: int, total: int, what: str) -> None:
            _write(out / "progress.json", {"done": done, "total": total, "what": what})

        raw = run_profile(spec, ctx.rank, ctx.world, ctx.device, progress)
        if ctx.rank == 0:
            raw["device_name"] = (torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda"
                                  else _cpu_name())
            raw["backend"] = dist.get_backend()
            raw["torch"] = torch.__version__
            _write(out / "raw.json", raw)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure must end this rank, fast
        from uniap.runtime.worker import _write_error

        _write_error(out, exc)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


if __name__ == "__main__":
    main()
