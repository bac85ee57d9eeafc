"""Multimodal inputs as they travel from the tokenizer manager to the model: per image, where its
placeholder span lies in the prompt, the processor's pixel values, and a hash of its content.

The span's token ids are *pad values* derived from that hash (SGLang's pad_value design), so the
radix cache, which keys on token ids, never lets two different images share KV, and the same image
asked about again hits it. radixlm puts the pad values above the vocabulary (SGLang takes the hash
mod 2**30, which may equal a real token id): no text prompt can spell an image's span. Leaf module.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

PAD_RANGE = 1 << 30


@dataclass(frozen=True, eq=False)  # compared and hashed by identity (tensors inside)
class MultimodalItem:
    """One image: its placeholder span [offset, offset + length) in the prompt's token ids."""

    hash: (
        int  # of the processed pixels (63 bits): the encoder cache's key and the pad value's source
    )
    offset: int
    length: int
    pixel_values: Any  # a torch tensor, the HF processor's output for this image
    modality: str = "image"
    extra: dict = field(
        default_factory=dict
    )  # model-specific processor outputs (image_sizes, grids)
    # The span as the decoder's grid of tokens (temporal, height, width; their product is `length`):
    # M-RoPE positions (Qwen2-VL, model/executor/mrope.py). None: a flat run (LLaVA, Idefics3).
    grid: tuple[int, int, int] | None = None

    def __post_init__(self):
        if self.grid is not None and self.grid[0] * self.grid[1] * self.grid[2] != self.length:
            raise ValueError(
                f"an image grid of {self.grid} tokens does not match its span of {self.length}"
            )

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, eq=False)
class MultimodalInputs:
    items: tuple[MultimodalItem, ...]
    # The tokens of one item's span attend each other both ways (Gemma 3); prefill chunks never
    # cut such a span (model/layers/attention/bidirectional.py).
    bidirectional: bool = False

    def overlapping(self, start: int, end: int) -> list[MultimodalItem]:
        """The items whose span meets the token range [start, end) (a prefill chunk's)."""
        return [it for it in self.items if it.offset < end and start < it.end]

    @property
    def last_end(self) -> int:
        return max((it.end for it in self.items), default=0)


def content_hash(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") >> 1


def pad_value(item_hash: int, vocab_size: int) -> int:
    """The token id every position of an image's span gets: above the vocabulary, from the hash."""
    return vocab_size + item_hash % PAD_RANGE


def is_pad(token_id: int, vocab_size: int) -> bool:
    return token_id >= vocab_size
