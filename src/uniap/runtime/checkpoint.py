"""Distributed checkpoints (torch.distributed.checkpoint) that any plan of the same model can load.

Layout under `checkpoint_dir`:
  step-00000006/   a complete checkpoint after 6 steps: DCP files + `.metadata` + `meta.json`
  .tmp-step-...    a checkpoint being written (ignored; a dying run leaves only this behind)

Every rank saves its stage's model and optimizer state as DCP state dicts from the distributed
state-dict API (`get_state_dict`, optimizer state flattened per parameter). Keys are the model's
parameter names (`embed.tok.weight`, `blocks.3.attn.q.weight`, `head.lm.weight`, ...), the same
whatever the plan, and values are sharded DTensors / local tensors, so a run under any other plan
(other pipeline split, tp, dp, ZeRO, world size) can load them: DCP reshards on load.

The write is atomic: DCP writes into `.tmp-step-N`; once every rank has finished, rank 0 writes
`meta.json` and renames the folder to `step-N`. `latest()` only considers renamed folders.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from uniap.errors import UniapError

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
PREFIX = "step-"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{PREFIX}{step:08d}"


def latest(root: str | Path | None) -> tuple[int, Path] | None:
    """The last complete checkpoint under `root`: (steps done, folder), or None."""
    if root is None or not Path(root).is_dir():
        return None
    best = None
    for child in Path(root).iterdir():
        if not child.name.startswith(PREFIX) or not (child / "meta.json").is_file():
            continue
        try:
            step = int(child.name[len(PREFIX):])
        except ValueError:
            continue
        if best is None or step > best[0]:
            best = (step, child)
    return best


def read_meta(path: Path) -> dict:
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UniapError(f"checkpoint {path} has no readable meta.json: {exc}") from None


def _states(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    model_sd, optim_sd = get_state_dict(module, optimizer, options=_OPTIONS)
    return {"model": model_sd, "optim": optim_sd}


def save(root: str | Path, step: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
         meta: dict) -> Path:
    """Collective: every rank calls it. Returns the final folder."""
    root = Path(root)
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    final = step_dir(root, step)
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a run that died while saving
    dist.barrier()
    dcp.save(_states(module, optimizer), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        with open(tmp / "meta.json", "w") as fh:
            json.dump({**meta, "step": step}, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        old = None
        if final.exists():
            old = root / f".old-{final.name}"
            if old.exists():
                shutil.rmtree(old)
            os.rename(final, old)
        os.rename(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(path: str | Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Collective: load a checkpoint written under any plan into this plan's stage."""
    state = _states(module, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_OPTIONS)
