"""M-RoPE positions (Qwen2-VL's multimodal rotary embedding): three per token, temporal, height and
width (transformers' Qwen2VLModel.get_rope_index is the reference).

A text token has its position in all three. An image's tokens take their place in the image's grid
(MultimodalItem.grid), each coordinate counted from the position the image starts at, and the text
after an image goes on from the image's largest position + 1. So a token's positions depend only on
its index in the sequence and on the images before it: a cached prefix keeps its positions whatever
follows (a radix-cache hit stays exact, chunked prefill may cut an image anywhere), and a token
after the last image (every generated token) is at index + mrope_delta in all three (SGLang's
mrope_position_delta, <= 0: what the images before it saved).
"""

from __future__ import annotations

import numpy as np
import torch

from radixlm.mm_inputs import MultimodalInputs, MultimodalItem
from radixlm.model.executor.worker_batch import ModelWorkerBatch


def _gridded(mm: MultimodalInputs) -> list[MultimodalItem]:
    return sorted((it for it in mm.items if it.grid is not None), key=lambda it: it.offset)


def _saved(it: MultimodalItem) -> int:
    """How far an image moves the positions after it back: its tokens minus the positions it spans
    (transformers advances by max(height, width) over an image)."""
    _, h, w = it.grid
    return it.length - max(h, w)


def mrope_delta(mm: MultimodalInputs | None) -> int:
    """The position of a token after every image of the request, minus its index."""
    return 0 if mm is None else -sum(_saved(it) for it in _gridded(mm))


def request_positions(mm: MultimodalInputs | None, index: np.ndarray) -> np.ndarray:
    """[3, n] M-RoPE positions of a request's tokens at sequence indices `index` (any order)."""
    index = np.asarray(index, dtype=np.int64)
    items = [] if mm is None else _gridded(mm)
    if (
        not items or index.size == 0 or index.min() >= items[-1].end
    ):  # text only, or all after the images (decode)
        return np.repeat(index[None, :] + mrope_delta(mm), 3, axis=0)
    out = np.repeat(index[None, :], 3, axis=0)
    shift = 0
    for it in items:
        _, h, w = it.grid
        inside = (index >= it.offset) & (index < it.end)
        if inside.any():
            k = index[inside] - it.offset
            start = it.offset - shift
            out[0, inside] = start + k // (h * w)
            out[1, inside] = start + (k // w) % h
            out[2, inside] = start + k % w
        out[:, index >= it.end] -= _saved(it)
        shift += _saved(it)
    return out


def mrope_positions(b: ModelWorkerBatch, device: torch.device) -> torch.Tensor | None:
    """[3, num_tokens] for a step of an M-RoPE model, None when no request of it has an image
    (then every row equals b.positions: plain RoPE)."""
    if not any(mm is not None for mm in b.mm_inputs):
        return None
    counts = b.extend_seq_lens if b.forward_mode.is_extend() else [1] * b.batch_size
    index = np.asarray(b.positions, dtype=np.int64)
    out = np.repeat(index[None, :], 3, axis=0)
    start = 0
    for mm, n in zip(b.mm_inputs, counts):
        if mm is not None and n:
            out[:, start : start + n] = request_positions(mm, index[start : start + n])
        start += n
    return torch.from_numpy(out).to(device)
