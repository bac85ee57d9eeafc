"""What an EAGLE source keeps of the target's forwards: per request row, the hidden states (EAGLE's
final hidden state, EAGLE-3's three layer streams side by side) of the tokens the target computed
since the source last caught its head up, with their positions and input ids.

A row is named by (req_pool_idx, generation): ReqToTokenPool bumps the generation when it hands
the row to another request, so spans of a finished request are never read as a new one's (and go
when the row is reused). A request that drafts nothing for a long time keeps at most
MAX_ROWS_PER_REQUEST rows (the oldest go: the head's KV at those positions is then approximate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixlm.cache.memory_pool import ReqToTokenPool
    from radixlm.model.forward_batch import ForwardBatch

MAX_ROWS_PER_REQUEST = 4096


@dataclass
class Span:
    start: int  # position of the first row
    ids: torch.Tensor  # [n] int64: the token each row's forward read (cpu)
    hidden: torch.Tensor  # [n, features]

    @property
    def end(self) -> int:
        return self.start + int(self.ids.shape[0])


class EagleCapture:
    """A HiddenCapture (model/hidden_capture.py): aux_layers () keeps the final hidden states
    (EAGLE); three layers keep the streams entering them, concatenated low to high (EAGLE-3)."""

    def __init__(
        self, req_to_token_pool: ReqToTokenPool, features: int, aux_layers: tuple[int, ...] = ()
    ):
        self.pool = req_to_token_pool
        self.features = features
        self.aux_layers = tuple(aux_layers)
        self._streams: dict[int, torch.Tensor] = {}
        self._verify: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = (
            None  # the last verify step's rows
        )
        self._spans: dict[
            int, tuple[int, list[Span]]
        ] = {}  # row -> (generation, spans in arrival order)

    # ---------------------------------------------------------------- HiddenCapture
    def record_layer(self, layer: int, stream: torch.Tensor) -> None:
        self._streams[layer] = stream

    def on_forward(self, fb: ForwardBatch, hidden: torch.Tensor) -> None:
        if self.aux_layers:
            streams, self._streams = self._streams, {}
            hidden = torch.cat([streams[i] for i in self.aux_layers], dim=-1)
        rows = fb.req_pool_indices.tolist()
        ids = fb.input_ids.cpu()
        if fb.forward_mode.is_decode():
            counts, starts = [1] * len(rows), [n - 1 for n in fb.seq_lens_cpu]
        else:
            counts, starts = fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu
        # A verify step's drafted requests keep the rows of their accepted path only, which the
        # source hears of after acceptance (add_accepted); the step's rows wait here until then.
        verify = fb.forward_mode.is_verify()
        self._verify = (hidden, fb.positions.cpu(), ids) if verify else None
        offset = 0
        for row, n, start in zip(rows, counts, starts):
            if n and not (verify and n > 1):
                self._add(
                    row,
                    Span(
                        start,
                        ids[offset : offset + n],
                        hidden[offset : offset + n].detach().clone(),
                    ),
                )
            offset += n

    def add_accepted(self, row: int, step_rows: list[int]) -> None:
        """The last verify step's rows `step_rows` (the root's, then each accepted node's, at
        positions following each other) are what request row `row` kept."""
        if self._verify is None:
            return
        hidden, positions, ids = self._verify
        index = torch.tensor(step_rows)
        self._add(
            row,
            Span(
                int(positions[step_rows[0]]),
                ids[index],
                hidden[index.to(hidden.device)].detach().clone(),
            ),
        )

    # ---------------------------------------------------------------- the source's side
    def _add(self, row: int, span: Span) -> None:
        gen = self.pool.generation[row]
        held = self._spans.get(row)
        if held is None or held[0] != gen:
            held = self._spans[row] = (gen, [])
        spans = held[1]
        spans.append(span)
        total = sum(int(s.ids.shape[0]) for s in spans)
        while total > MAX_ROWS_PER_REQUEST and len(spans) > 1:
            total -= int(spans.pop(0).ids.shape[0])

    def spans(self, row: int) -> list[Span]:
        """The spans captured for the request now holding `row` (oldest first)."""
        held = self._spans.get(row)
        return held[1] if held is not None and held[0] == self.pool.generation[row] else []

    def first_position(self, row: int) -> int | None:
        spans = self.spans(row)
        return min(s.start for s in spans) if spans else None

    def take(self, row: int, tokens: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, int]:
        """Hidden states for positions [lo, hi) whose captured input id is the request's token there
        (tokens: its ids, prompt + output), the latest capture winning; then the row's spans are
        dropped (the caller has caught up with them). -> ([hi - lo, features], rows found)."""
        spans = self.spans(row)
        out = torch.zeros(hi - lo, self.features, device=spans[0].hidden.device if spans else "cpu")
        found = torch.zeros(hi - lo, dtype=torch.bool)
        for s in spans:
            a, b = max(s.start, lo), min(s.end, hi)
            if a >= b:
                continue
            ok = s.ids[a - s.start : b - s.start] == tokens[a:b]
            sel = torch.nonzero(ok).flatten()
            out[a - lo + sel] = s.hidden[a - s.start + sel].to(out.dtype)
            found[a - lo + sel] = True
        self.drop(row)
        return out, int(found.sum())

    def drop(self, row: int) -> None:
        self._spans.pop(row, None)
