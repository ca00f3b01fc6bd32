"""Reading the JSON files users hand us (plans, runs, profiles, model configs) with one-line errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from uniap.errors import UniapError


def read_json_object(path: str | Path, what: str) -> dict:
    """The JSON object in `path`; `what` names the file in errors ("plan", "run", …)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UniapError(f"cannot read {what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UniapError(f"cannot read {what} {path}: {exc.__class__.__name__}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UniapError(f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    if not isinstance(data, dict):
        raise UniapError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def digest(data, sort_keys: bool = True) -> str:
    """The one short stable hash of JSON-able data (16 hex digits of SHA-256 over its JSON text): architecture
    ids (the fingerprints of plans, profiles and checkpoints), layer signatures, plan digests."""
    return hashlib.sha256(json.dumps(data, sort_keys=sort_keys, default=list).encode()).hexdigest()[:16]
