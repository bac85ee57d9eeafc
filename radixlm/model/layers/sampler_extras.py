"""The optional samplers of a batch: allowed_token_ids and bad_words (bans), DRY (a penalty),
typical_p and XTC (filters on the distribution). Built only when a row of the batch uses one
(SamplingBatchInfo.extras is None otherwise: the default path runs none of this).

Order, per row: penalties, logit_bias and bans (bad_words, allowed_token_ids), DRY; then
temperature, top-k / top-p / min-p, typical_p, XTC; then the draw. Greedy rows (temperature 0, top_k
1) take the argmax after the bans and penalties: typical_p and XTC, like top-p and min-p, do not
apply to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from radixlm.model.layers.dry import dry_penalties
from radixlm.sampling_params import SamplingParams


def bad_word_bans(words: Sequence[Sequence[int]], output_ids: Sequence[int]) -> list[int]:
    """vLLM's rule: a bad word's last token is banned when the output ends with the rest of it."""
    bans = []
    for w in words:
        k = len(w) - 1
        if k <= len(output_ids) and (k == 0 or list(output_ids[-k:]) == list(w[:-1])):
            bans.append(w[-1])
    return bans


def typical_filter(probs: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Locally typical sampling (HF's TypicalLogitsWarper): keep the tokens whose surprise is
    closest to the entropy, in that order, until their mass reaches `mass` (the crossing token
    stays). probs [n, V] (unnormalized, zero for tokens already dropped), mass [n]."""
    p = probs / probs.sum(-1, keepdim=True)
    logp = torch.log(p)
    entropy = -(p * logp).nan_to_num(0.0).sum(-1, keepdim=True)
    shifted = torch.where(p > 0, (-logp - entropy).abs(), torch.inf)
    s_sorted, order = torch.sort(shifted, dim=-1)
    cum = p.gather(-1, order).cumsum(-1)
    last = (cum < mass.unsqueeze(1)).sum(-1, keepdim=True).clamp(max=p.shape[-1] - 1)
    return probs.masked_fill(shifted > s_sorted.gather(-1, last), 0.0)


def xtc_filter(probs: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Exclude top choices (llama.cpp's XTC): when two or more tokens have a probability of at least
    `threshold`, drop all of them but the least likely (tied least likely ones all stay).
    probs [n, V] (unnormalized), threshold [n]."""
    p = probs / probs.sum(-1, keepdim=True)
    above = (p >= threshold.unsqueeze(1)) & (
        p > 0
    )  # among the tokens still in (as llama.cpp's candidates)
    lowest = torch.where(above, p, torch.inf).amin(-1, keepdim=True)
    drop = above & (p > lowest) & (above.sum(-1, keepdim=True) >= 2)
    return probs.masked_fill(drop, 0.0)


@dataclass
class ExtraSampling:
    bans: dict[int, list[int]] = field(default_factory=dict)  # row -> token ids at -inf (bad_words)
    allowed: dict[int, list[int]] = field(
        default_factory=dict
    )  # row -> the only token ids it may take
    dry: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # rows, token ids, penalties
    typical_rows: torch.Tensor | None = None
    typical_ps: torch.Tensor | None = None
    xtc_rows: list[int] = field(default_factory=list)
    xtc_probabilities: list[float] = field(default_factory=list)
    xtc_thresholds: torch.Tensor | None = None
    xtc_generators: list[torch.Generator | None] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        output_ids: Sequence[Sequence[int]],
        prompt_ids: Sequence[Sequence[int]],
        generators: Sequence[torch.Generator | None],
        greedy: Sequence[bool],
        device: torch.device,
    ) -> ExtraSampling:
        ex = cls()
        dry_rows, dry_ids, dry_vals, typ_rows, typ_ps, xtc_thr = [], [], [], [], [], []
        for i, p in enumerate(params):
            if not p.uses_extra_samplers:
                continue
            tokens = p.resolved_tokens
            if p.uses_history_samplers and tokens is None:
                raise ValueError(
                    "bad_words / DRY need their token forms (the tokenizer manager makes them)"
                )
            if p.bad_words:
                bans = bad_word_bans(tokens.bad_words, output_ids[i])
                if bans:
                    ex.bans[i] = bans
            if p.allowed_token_ids is not None:
                ex.allowed[i] = p.allowed_token_ids
            if p.dry_active:
                context = list(prompt_ids[i]) + list(output_ids[i])
                for tok, pen in dry_penalties(
                    context, p, tokens.dry_single, tokens.dry_multi
                ).items():
                    dry_rows.append(i)
                    dry_ids.append(tok)
                    dry_vals.append(pen)
            if greedy[i]:
                continue
            if p.typical_p < 1:
                typ_rows.append(i)
                typ_ps.append(p.typical_p)
            if p.xtc_active:
                ex.xtc_rows.append(i)
                ex.xtc_probabilities.append(p.xtc_probability)
                ex.xtc_generators.append(generators[i])
                xtc_thr.append(p.xtc_threshold)
        ids = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)
        floats = lambda xs: torch.tensor(xs, dtype=torch.float32, device=device)
        if dry_rows:
            ex.dry = (ids(dry_rows), ids(dry_ids), floats(dry_vals))
        if typ_rows:
            ex.typical_rows, ex.typical_ps = ids(typ_rows), floats(typ_ps)
        if xtc_thr:
            ex.xtc_thresholds = floats(xtc_thr)
        return ex

    @property
    def masks(self) -> bool:
        return bool(self.bans or self.allowed)

    def fill_mask(self, vocab_mask: torch.Tensor) -> None:
        """Bans into the batch's additive [bs, vocab] mask (-inf)."""
        for i, bans in self.bans.items():
            vocab_mask[i, torch.tensor(bans, dtype=torch.int64, device=vocab_mask.device)] = float(
                "-inf"
            )
        for i, allowed in self.allowed.items():
            keep = torch.zeros(vocab_mask.shape[1], dtype=torch.bool, device=vocab_mask.device)
            keep[torch.tensor(allowed, dtype=torch.int64, device=vocab_mask.device)] = True
            vocab_mask[i].masked_fill_(~keep, float("-inf"))

    def penalize(self, logits: torch.Tensor) -> torch.Tensor:
        """DRY, on the logits (before temperature, as llama.cpp's chain)."""
        if self.dry is None:
            return logits
        rows, ids, vals = self.dry
        return logits.index_put((rows, ids), -vals, accumulate=True)

    def filter(self, probs: torch.Tensor) -> torch.Tensor:
        """typical_p, then XTC, on the sampled rows' probabilities (after top-k / top-p / min-p).
        XTC draws its coin from the row's own generator (seeded requests stay reproducible)."""
        if self.typical_rows is not None:
            probs[self.typical_rows] = typical_filter(probs[self.typical_rows], self.typical_ps)
        if self.xtc_rows:
            coins = [float(torch.rand((), generator=g)) for g in self.xtc_generators]
            hit = [k for k, (c, pr) in enumerate(zip(coins, self.xtc_probabilities)) if c <= pr]
            if hit:
                rows = torch.tensor(
                    [self.xtc_rows[k] for k in hit], dtype=torch.int64, device=probs.device
                )
                thr = self.xtc_thresholds[torch.tensor(hit, dtype=torch.int64, device=probs.device)]
                probs[rows] = xtc_filter(probs[rows], thr)
        return probs
