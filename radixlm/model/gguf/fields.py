"""GGUF metadata values, and the readings of them that several architecture families share."""

from __future__ import annotations

from typing import Any


def field(reader, key: str, default: Any = None) -> Any:
    """The value of metadata key `key` (default when the file has none)."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def required(reader, arch: str, key: str) -> Any:
    """{arch}.{key}, or a ValueError naming it."""
    value = field(reader, f"{arch}.{key}")
    if value is None:
        raise ValueError(f"{arch} GGUF without {arch}.{key}")
    return value


def per_layer(reader, arch: str, key: str, n_layers: int) -> list[int]:
    """{arch}.{key} as one int per layer (the hybrids' layer types are read from such a list)."""
    value = field(reader, f"{arch}.{key}")
    if not isinstance(value, list) or len(value) != n_layers:
        raise ValueError(
            f"{arch} GGUF: {arch}.{key} must list one value per layer ({n_layers}), got {value!r}"
            " (the layer types are read from it)"
        )
    return [int(v) for v in value]


def has_tensor(reader, suffix: str) -> bool:
    """Whether any tensor's name ends with `suffix` (an optional bias, norm)."""
    return any(t.name.endswith(suffix) for t in reader.tensors)


def layer_types(reader, arch: str, n_layers: int, period: int | None = None) -> list[str]:
    """Per layer, sliding_attention or full_attention: the file's sliding_window_pattern where a
    newer converter wrote one (a flag per layer, or a period), else `period`, llama.cpp's fixed one
    for the architecture (layer il is local when il % n < n - 1, as HF's (il + 1) % n != 0)."""
    pattern = field(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        local = [bool(p) for p in pattern]
    else:
        if not pattern and period is None:
            raise ValueError(f"{arch} GGUF without {arch}.attention.sliding_window_pattern")
        n = int(pattern or period)
        local = [il % n < n - 1 for il in range(n_layers)]
    return ["sliding_attention" if is_local else "full_attention" for is_local in local]
