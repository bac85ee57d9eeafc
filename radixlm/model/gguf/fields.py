"""One GGUF metadata value, for gguf_loader and the per-family readers it imports."""

from __future__ import annotations

from typing import Any


def field(reader, key: str, default: Any = None) -> Any:
    """The value of metadata key `key` (default when the file has none)."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()
