"""Image spans whose tokens attend each other both ways (Gemma 3: HF's token_type_ids mask, causal
OR same image, and on a sliding layer that AND the window) in an extend.

A query at position q inside an image that ends at e sees the keys [0, e) (a sliding layer: the keys
(q - window, e)), where a causal query sees [0, q]. Admission never cuts an image span between
prefill chunks (scheduler/batching/admission.py), so an extend that holds an image's queries holds
its keys up to e; a cached prefix may end inside a span (its keys were computed with the whole image
in view, so they are the ones this extend would compute).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.model.forward_batch import ForwardBatch


@dataclass(frozen=True)
class BidiSpan:
    req: int  # the request's index in the batch
    row: int  # the span's first query row in the batch
    pos: int  # that query's position
    end: int  # the image's end: every query of the span sees the keys before it

    @property
    def count(self) -> int:
        return self.end - self.pos


def bidirectional_spans(fb: ForwardBatch) -> list[BidiSpan]:
    """The image spans of an extend batch whose tokens attend each other both ways."""
    if not fb.mm_inputs or not fb.forward_mode.is_extend() or fb.tree_mask is not None:
        return []
    out, row = [], 0
    for i, n in enumerate(fb.extend_seq_lens_cpu):
        mm = fb.mm_inputs[i] if i < len(fb.mm_inputs) else None
        p = fb.extend_prefix_lens_cpu[i]
        if mm is not None and mm.bidirectional:
            for it in mm.overlapping(p, p + n):
                if it.end > p + n:
                    raise AssertionError(
                        f"request {i}: an extend of [{p}, {p + n}) cuts the image span"
                        f" [{it.offset}, {it.end}) whose tokens attend each other both ways"
                    )
                lo = max(it.offset, p)
                out.append(BidiSpan(i, row + lo - p, lo, it.end))
        row += n
    return out


@dataclass
class BidiQueries:
    """The image queries of a batch as one-query requests for the paged kernel, each over its own
    keys: [0, end) on a full layer (its request's row, seq_len end), (q - window, end) on a sliding
    layer (a row of its own, built once per window and slot space)."""

    rows: torch.Tensor  # [m] int64: the queries' rows in the batch
    pos: torch.Tensor  # [m] their positions
    req: torch.Tensor  # [m] their requests' rows in the batch's slot table
    end: torch.Tensor  # [m] their images' ends
    q_start: torch.Tensor  # [m + 1]: 0..m
    _windowed: dict = field(default_factory=dict)

    @classmethod
    def of(cls, spans: list[BidiSpan]) -> BidiQueries | None:
        if not spans:
            return None

        def cat(f) -> torch.Tensor:
            return torch.cat([f(s) for s in spans]).to(torch.int64)

        return cls(
            rows=cat(lambda s: torch.arange(s.row, s.row + s.count)),
            pos=cat(lambda s: torch.arange(s.pos, s.end)),
            req=cat(lambda s: torch.full((s.count,), s.req)),
            end=cat(lambda s: torch.full((s.count,), s.end)),
            q_start=torch.arange(sum(s.count for s in spans) + 1, dtype=torch.int64),
        )

    def keys(
        self, slots: torch.Tensor, window: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(slot table, each query's row in it, its key count) for the kernel with no window."""
        if not window:
            return slots, self.req, self.end
        key = (id(slots), window)
        if key not in self._windowed:
            lo = (self.pos - window + 1).clamp(min=0)
            lens = self.end - lo
            cols = (lo[:, None] + torch.arange(int(lens.max()))[None, :]).clamp(
                max=slots.shape[1] - 1
            )
            table = slots[self.req[:, None], cols]
            self._windowed[key] = (table, torch.arange(len(lo), dtype=torch.int64), lens)
        return self._windowed[key]


def add_to_mask(
    mask: torch.Tensor, spans: list[BidiSpan], prefix: int, window: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One request's causal [new, prefix + new] mask with its spans' queries seeing up to their
    images' ends, and that mask within each query's window (None: no window)."""
    mask = mask.clone()
    for s in spans:
        mask[s.pos - prefix : s.end - prefix, s.pos : s.end] = True
    if window is None:
        return mask, None
    device = mask.device
    pos_k = torch.arange(mask.shape[1], device=device)
    pos_q = torch.arange(prefix, prefix + mask.shape[0], device=device)
    return mask, mask & (pos_k[None, :] > pos_q[:, None] - window)
