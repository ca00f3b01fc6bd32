"""Per-rank entry point of `uniap profile`: `python -m uniap.profile.worker SPEC.json OUT_DIR`.

Rank 0 writes OUT_DIR/progress.json while measuring (the launcher draws the progress bar from it) and its raw
measurements as the result; failures are handled as for every rank (`uniap.runtime.launcher.rank_main`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from uniap.runtime.launcher import rank_main, write_json


def _body(spec: dict, out: Path) -> dict | None:
    from uniap.profile.harness import run_profile
    from uniap.runtime.worker import init_distributed

    ctx = init_distributed(float(spec.get("timeout_s", 120.0)))

    def progress(done: int, total: int, what: str) -> None:
        write_json(out / "progress.json", {"done": done, "total": total, "what": what})

    raw = run_profile(spec, ctx.rank, ctx.world, ctx.device, progress)
    if ctx.rank == 0:
        raw["device_name"] = (torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda"
                              else _cpu_name())
        raw["backend"] = dist.get_backend()
        raw["torch"] = torch.__version__
    return raw


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
    rank_main(_body, "python -m uniap.profile.worker SPEC.json OUT_DIR")
