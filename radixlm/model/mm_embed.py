"""Image embeddings in a prefill: the vision encoder's outputs, kept in an LRU keyed by the image's
content hash (--mm-cache-size-mb), scattered over the rows of the image spans an extend covers.

An extend may start or end inside an image span (chunked prefill, or a radix-cache hit that covers
part of it): it takes the rows [lo, hi) of the image's embedding it needs. The encoder runs only for
the images this step needs and the cache lacks, all of them in one batch (whatever requests they
belong to).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from radixlm.mm_inputs import MultimodalItem
from radixlm.model.forward_batch import ForwardBatch

# pixel values of some images -> one embedding [span length, hidden] per image, in order
EncodeFn = Callable[[list[MultimodalItem]], list[torch.Tensor]]


class EncoderCache:
    """LRU of encoder outputs by image hash, bounded in bytes; counts what the encoder did."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self.encoder_runs = 0  # forward passes of the vision encoder (each a batch of images)
        self.images_encoded = 0
        self.cache_hits = 0  # images an extend needed and found here

    def get_or_encode(
        self, items: list[MultimodalItem], encode: EncodeFn
    ) -> dict[int, torch.Tensor]:
        out: dict[int, torch.Tensor] = {}
        missing: dict[int, MultimodalItem] = {}
        for it in items:
            if it.hash in out or it.hash in missing:
                continue
            hit = self._entries.get(it.hash)
            if hit is not None:
                self._entries.move_to_end(it.hash)
                self.cache_hits += 1
                out[it.hash] = hit
            else:
                missing[it.hash] = it
        if missing:
            todo = list(missing.values())
            embeds = encode(todo)
            self.encoder_runs += 1
            self.images_encoded += len(todo)
            for it, e in zip(todo, embeds):
                if e.shape[0] != it.length:
                    raise ValueError(
                        f"the encoder gave {e.shape[0]} embeddings for an image span of {it.length}"
                        " tokens"
                    )
                out[it.hash] = e
                self._put(it.hash, e)
        return out

    def _put(self, key: int, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if size > self.max_bytes:
            return
        self._entries[key] = value
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def info(self) -> dict:
        return {
            "mm_encoder_runs": self.encoder_runs,
            "mm_images_encoded": self.images_encoded,
            "mm_encoder_cache_hits": self.cache_hits,
            "mm_encoder_cache_images": len(self._entries),
            "mm_encoder_cache_bytes": self._bytes,
        }


def image_pieces(
    fb: ForwardBatch, cache: EncoderCache, encode: EncodeFn
) -> list[tuple[int, torch.Tensor]] | None:
    """The pieces of image spans an extend covers: (its first row in the batch, the rows of its
    image's encoder output it takes), encoding the images the cache lacks. None: no image span
    here (or no extend)."""
    if not fb.mm_inputs or not fb.forward_mode.is_extend():
        return None
    needs = []  # (first row in the batch, item, first row of the item's embedding, end row)
    row = 0
    for i, n in enumerate(fb.extend_seq_lens_cpu):
        mm = fb.mm_inputs[i] if i < len(fb.mm_inputs) else None
        p = fb.extend_prefix_lens_cpu[i]
        if mm is not None:
            for it in mm.overlapping(p, p + n):
                lo, hi = max(it.offset, p), min(it.end, p + n)
                needs.append((row + lo - p, it, lo - it.offset, hi - it.offset))
        row += n
    if not needs:
        return None
    feats = cache.get_or_encode([it for _, it, _, _ in needs], encode)
    return [(start, feats[it.hash][a:b]) for start, it, a, b in needs]


def embed_with_images(
    fb: ForwardBatch,
    input_ids: torch.Tensor,
    embed: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
    cache: EncoderCache,
    encode: EncodeFn,
) -> torch.Tensor | None:
    """The input embeddings of an extend whose requests have images (None: no image in the batch:
    the model embeds its ids as usual). Pad values (ids >= vocab_size) embed as token 0 first, then
    their rows get the image's."""
    pieces = image_pieces(fb, cache, encode)
    if pieces is None:
        return None
    hidden = embed(input_ids.masked_fill(input_ids >= vocab_size, 0))
    for start, rows in pieces:
        hidden[start : start + rows.shape[0]] = rows.to(hidden.dtype)
    return hidden
