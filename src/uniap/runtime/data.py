"""Training data by step index, identical on every rank and in the one-process reference.

Step s's batch depends only on (seed, s), so a run resumed at step s sees exactly the batches an
uninterrupted run would.

- synthetic (default): each sample is an arithmetic progression of tokens modulo the vocabulary
  with a random start and a random stride in 1..7 — learnable, so the loss visibly falls;
- text file: its bytes, modulo the vocabulary, are the token stream; each sample is a window at a
  random offset.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from uniap.errors import UniapError


def _generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed((int(seed) * 7_777_777 + int(step) * 104_729 + 99) % (2**63 - 1))


@lru_cache(maxsize=4)
def _text_tokens(path: str, vocab: int) -> torch.Tensor:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UniapError(f"cannot read data file {path}: {exc.strerror}") from None
    return torch.tensor(list(raw), dtype=torch.long) % vocab


def batch(step: int, global_batch: int, seq_len: int, vocab: int, seed: int = 0,
          data: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), both int64 (global_batch, seq_len); targets are inputs shifted by one."""
    gen = _generator(seed, step)
    if data is None:
        start = torch.randint(0, vocab, (global_batch, 1), generator=gen)
        stride = torch.randint(1, 8, (global_batch, 1), generator=gen)
        seq = (start + stride * torch.arange(seq_len + 1)[None, :]) % vocab
    else:
        stream = _text_tokens(str(data), vocab)
        if stream.numel() < seq_len + 2:
            raise UniapError(f"data file {data} holds {stream.numel()} bytes; need at least {seq_len + 2}")
        offsets = torch.randint(0, stream.numel() - seq_len - 1, (global_batch,), generator=gen)
        seq = torch.stack([stream[o:o + seq_len + 1] for o in offsets.tolist()])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
