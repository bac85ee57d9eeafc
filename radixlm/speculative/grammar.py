"""Drafts under a grammar: cut where the grammar rejects, and one mask per verify row.

A constrained request drafts like any other; its draft is cut before the first token its matcher
rejects (that token could never be emitted), and verification masks row j with the matcher's
state after draft[:j], exactly the mask decoding would have used at that position. The matcher is
walked forward for that and rolled back at once: the emitted tokens then advance it the usual way
(one accept_token each), so nothing that was not accepted stays in its state.
"""

from __future__ import annotations

import torch


def cut_draft(grammar, draft: list[int]) -> list[int]:
    """The longest prefix of draft that grammar accepts; the matcher is left as it was."""
    n = 0
    try:
        for tok in draft:
            if not grammar.accept_token(tok):
                break
            n += 1
    finally:
        grammar.rollback(n)
    return draft[:n]


def masked_draft_rows(backend, grammar, draft: list[int], rows: torch.Tensor) -> torch.Tensor:
    """rows [len(draft) + 1, vocab] with row j's disallowed tokens at -inf (a copy), j's mask
    taken after draft[:j]. draft must be one cut_draft returned."""
    mask = backend.allocate_vocab_mask(rows.shape[1], rows.shape[0])
    n = 0
    try:
        for j in range(rows.shape[0]):
            grammar.fill_vocab_mask(mask, j)
            if j < len(draft):
                if not grammar.accept_token(draft[j]):
                    raise RuntimeError(f"the grammar rejects draft token {draft[j]} it accepted when cut")
                n += 1
    finally:
        grammar.rollback(n)
    rows = rows.clone()
    backend.apply_vocab_mask(rows, backend.move_vocab_mask(mask, rows.device))
    return rows
