"""A chain of several kinds of block, bounded as if it had one: the relaxation the device-group bounds need.

The device-group bounds (solve.group_bound for interleaved 1F1B, solve.split_bound for zero bubble) read a chain
of an embedding, one run of identical blocks and a head. Models whose blocks alternate kinds (GPT-OSS: sliding and
full attention; Gemma: local and global) fold into one run per layer, so those bounds did not apply and their
searches ran on the cheap bound alone: GPT-OSS 120B's stopped at the time limit 19-24 % from proven.

`one_block_relaxation` replaces every block by one that costs, per strategy, the least of any block: time,
sync, static and activation bytes, and the resharding and sends between blocks. Every plan of the program is a
plan of the relaxation that costs no more and fits wherever it did (the TPI rises with every chunk time, pass,
send and sync, and memory with every byte), so a bound on the relaxation bounds the program. Both bounds take it
themselves where the chain is not of their shape, and only their bound: its plans are not the program's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from uniap.program import StageProgram, distinct_rows
from uniap.schedules import FORWARD_SHARE


def one_block_relaxation(program: StageProgram) -> StageProgram | None:
    """The program with its blocks (every layer but the first and the last) replaced by the least of them, entry
    by entry; None where the chain is already an embedding, one run of blocks and a head (or too short for
    blocks). A split backward's passes are relaxed each to its least, F, I = (1 − FORWARD_SHARE)·A − w and W = w:
    A = (least I + least W) / (1 − FORWARD_SHARE) is then at most every block's A, so F = FORWARD_SHARE·A is too."""
    L = program.layers
    if L < 3 or one_kind_of_block(program):
        return None
    ok = np.asarray(program.allowed)
    blocks, inner = slice(1, L - 1), slice(1, L - 2)  # the blocks, and the edges between two blocks
    allowed = ok.copy()
    allowed[blocks] = ok[blocks].any(axis=0)

    def least(table, edges: bool = False):
        """Per block strategy (pair, for an edge table), the least over the blocks (edges) that allow it; 0 where
        none of them does (the relaxation may allow more than any one block did)."""
        out = np.where(ok if not edges else _pairs(ok), np.asarray(table, dtype=float), np.inf)
        where = inner if edges else blocks
        if where.stop > where.start:
            out[where] = out[where].min(axis=0)
        return np.where(np.isfinite(out), out, 0.0)

    changes = dict(A=least(program.A), G=least(program.G), Ms=least(program.Ms), Ma=least(program.Ma),
                   R=least(program.R, edges=True), Rp=least(program.Rp, edges=True), allowed=allowed,
                   group=np.array([0] + [1] * (L - 2) + [2]))
    if program.weight_gradient is not None:
        w = least(program.weight_gradient)
        rest = least((1 - FORWARD_SHARE) * np.asarray(program.A, dtype=float) - np.asarray(program.weight_gradient))
        changes["A"][blocks] = (rest[blocks] + w[blocks]) / (1 - FORWARD_SHARE)
        changes["weight_gradient"] = w
    return dataclasses.replace(program, **changes)


def one_kind_of_block(program: StageProgram) -> bool:
    """Whether the chain is an embedding, one run of blocks of one kind and a head, by its layer groups."""
    firsts, lengths = distinct_rows(program.group)
    return len(firsts) == 3 and lengths[0] == 1 and lengths[2] == 1


def _pairs(ok: np.ndarray) -> np.ndarray:
    """(L − 1, K, K): the strategy pairs each edge allows."""
    return ok[:-1, :, None] & ok[1:, None, :]
