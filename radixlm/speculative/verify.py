"""Acceptance of a draft chain from the target model's rows.

rows[j] is the target's logits after the request's tokens plus draft[:j] (j = 0..k), raw (as
decoding samples from them; grammar-masked for a constrained request).

Greedy keeps the longest prefix of the draft that equals the target's argmax chain, then the
target's own next token: exactly the tokens plain greedy decoding gives.

Sampling is speculative (rejection) sampling with a deterministic proposal q = one-hot(d_j):
accept d_j with probability p_j(d_j); on rejection draw from p_j with d_j removed and
renormalised, max(p - q, 0) / Z; with every draft accepted draw the bonus token from p_k. Each
emitted token is then distributed exactly as p_j: P(d) = p(d) and, for t != d,
P(t) = (1 - p(d)) * p(t) / (1 - p(d)) = p(t).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from radixlm.model.layers.sampler import SamplingBatchInfo, SamplingRow, top_k_top_p_min_p
from radixlm.sampling_params import SamplingParams


def accept_greedy(rows: torch.Tensor, draft: Sequence[int]) -> list[int]:
    targets = torch.argmax(rows, dim=-1).tolist()
    a = 0
    while a < len(draft) and draft[a] == targets[a]:
        a += 1
    return list(draft[:a]) + [targets[a]]


def target_probs(rows: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from for each row: temperature, then top-k / top-p / min-p."""
    n, vocab = rows.shape
    info = SamplingBatchInfo.build([SamplingRow(params)] * n, vocab, rows.device)
    probs = torch.softmax(rows / info.temperatures, dim=-1)
    if info.need_top_k or info.need_top_p or info.need_min_p:
        probs = top_k_top_p_min_p(probs, info)
    return probs / probs.sum(dim=-1, keepdim=True)


def accept_sampling(rows: torch.Tensor, draft: Sequence[int], params: SamplingParams,
                    generator: Optional[torch.Generator] = None) -> list[int]:
    probs = target_probs(rows, params).cpu()
    out: list[int] = []
    for j, d in enumerate(draft):
        p = probs[j]
        if float(torch.rand((), generator=generator)) < float(p[d]):
            out.append(int(d))
            continue
        residual = p.clone()
        residual[d] = 0.0
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return out


def accept_draft(rows: torch.Tensor, draft: Sequence[int], params: SamplingParams,
                 generator: Optional[torch.Generator] = None) -> list[int]:
    """The tokens a verify step emits for one request: accepted drafts, then one token of the target's."""
    assert rows.shape[0] == len(draft) + 1, (rows.shape, len(draft))
    if params.is_greedy:
        return accept_greedy(rows, draft)
    return accept_sampling(rows, draft, params, generator)
