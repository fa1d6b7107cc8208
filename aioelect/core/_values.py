"""The keys and values of fenced state: what may be stored, and how it is written down.

A value is JSON: ``str``, ``int``, finite ``float``, ``bool``, lists and
dicts with string keys, nested as deep as JSON allows, and not ``None`` at
the top (``None`` is what :meth:`~aioelect.FencedStore.get` returns for a
key with no value). It is stored as its canonical encoding (UTF-8, keys
sorted, no spaces), at most :data:`MAX_VALUE_BYTES` bytes; a compare-and-set
compares those encodings. A key is 1 to :data:`MAX_KEY_LENGTH` printable
ASCII characters.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_KEY_LENGTH", "MAX_VALUE_BYTES", "check_key", "decode", "encode"]

#: The largest encoded value a fenced store takes: small state (a cursor, a checkpoint), not a blob store.
MAX_VALUE_BYTES = 64 * 1024
#: The longest key.
MAX_KEY_LENGTH = 128
_KEY_RE = re.compile(r"[\x21-\x7e]+")


def check_key(key: object) -> str:
    """``key`` if it is 1 to :data:`MAX_KEY_LENGTH` printable ASCII characters without spaces; else ValueError."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a fenced state key must be a non-empty string, not {key!r}"[:200])
    if len(key) > MAX_KEY_LENGTH or not _KEY_RE.fullmatch(key):
        raise ValueError(
            f"fenced state key {key[:40]!r}: at most {MAX_KEY_LENGTH} printable ASCII characters without spaces"
        )
    return key


def encode(value: object) -> bytes:
    """``value``'s canonical JSON; ValueError for None at the top, TypeError for what JSON cannot hold,
    ValueError for a value whose encoding is larger than :data:`MAX_VALUE_BYTES`."""
    if value is None:
        raise ValueError("None cannot be stored: it is what get() returns for a key with no value")
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"fenced state holds JSON (str, int, finite float, bool, lists, dicts with str keys): {exc}"
        ) from None
    data = text.encode()
    if len(data) > MAX_VALUE_BYTES:
        raise ValueError(f"value is {len(data)} bytes as JSON; fenced state takes at most {MAX_VALUE_BYTES}")
    return data


def decode(data: bytes | None) -> Any:
    """The value ``data`` encodes (None for None)."""
    return None if data is None else json.loads(data)
