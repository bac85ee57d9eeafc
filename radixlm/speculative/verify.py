"""Acceptance of a draft tree (a chain is the tree of one path) from the target model's rows.

rows[0] is the target's logits after the request's tokens (the root: its next input), rows[1 + i]
its logits after the request's tokens plus node i's path; raw, as decoding samples from them
(grammar-masked for a constrained request).

Greedy walks down from the root: the child whose token is the target's argmax at the current node
is accepted and becomes the current node; where no child has it, the target's own argmax ends the
step. The emitted tokens are exactly those plain greedy decoding gives.

Sampling is multi-candidate rejection sampling with one-hot proposals (SpecInfer's, the draft
being deterministic): at the current node, with p the target's distribution there, the children
are tried in order; child d is accepted with probability p(d); on rejection p becomes p with d
removed and renormalised, and the next child is tried against it; when every child is rejected a
token is drawn from what is left of p, and where a node has no children the token is drawn from its
p. Each emitted token is then distributed exactly as p: after rejecting d_1 .. d_{j-1}, child d_j
is emitted with probability (1 - p(d_1) - .. - p(d_{j-1})) * p(d_j) / (1 - p(d_1) - .. - p(d_{j-1}))
= p(d_j), and a token t that is no child with (1 - sum_j p(d_j)) * p(t) / (1 - sum_j p(d_j)) = p(t).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixlm.model.layers.sampler import SamplingBatchInfo, SamplingRow, top_k_top_p_min_p
from radixlm.sampling_params import SamplingParams
from radixlm.speculative.draft_tree import ROOT, DraftTree


@dataclass(frozen=True)
class Acceptance:
    """What a verify step gives one request: the tokens it emits (the accepted nodes' tokens, then
    one token of the target's) and the accepted nodes (indices into the tree, root excluded)."""

    tokens: list[int]
    path: list[int]


def _children(tree: DraftTree) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        out.setdefault(p, []).append(i)
    return out


def accept_greedy_tree(rows: torch.Tensor, tree: DraftTree) -> Acceptance:
    # max(dim).indices: the first maximal index, as argmax (torch documents both), ~3x faster on CPU
    # over a verify step's [rows, vocab] logits.
    targets = rows.max(dim=-1).indices.tolist()
    kids, node, path = _children(tree), ROOT, []
    while True:
        want = targets[node + 1]
        nxt = next((c for c in kids.get(node, ()) if tree.tokens[c] == want), None)
        if nxt is None:
            return Acceptance(tree.path_tokens(path) + [want], path)
        path.append(nxt)
        node = nxt


def target_probs(rows: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws from for each row: temperature, then top-k / top-p /
    min-p."""
    n, vocab = rows.shape
    info = SamplingBatchInfo.build([SamplingRow(params)] * n, vocab, rows.device)
    probs = torch.softmax(rows / info.temperatures, dim=-1)
    if info.need_top_k or info.need_top_p or info.need_min_p:
        probs = top_k_top_p_min_p(probs, info)
    return probs / probs.sum(dim=-1, keepdim=True)


def accept_sampling_tree(
    rows: torch.Tensor,
    tree: DraftTree,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> Acceptance:
    return sample_tree(target_probs(rows, params).cpu(), tree, generator)


def sample_tree(
    probs: torch.Tensor, tree: DraftTree, generator: torch.Generator | None = None
) -> Acceptance:
    """The rejection sampling walk over the target's distributions (probs: rows' target_probs)."""
    kids, node, path = _children(tree), ROOT, []
    while True:
        p, accepted = probs[node + 1], None
        for c in kids.get(node, ()):
            d = tree.tokens[c]
            if float(torch.rand((), generator=generator)) < float(p[d]):
                accepted = c
                break
            p = p.clone()
            p[d] = 0.0
            total = float(p.sum())
            if total <= 0.0:  # d held all the mass (rejected by rounding alone): it is the token
                accepted = c
                break
            p /= total
        if accepted is None:
            return Acceptance(
                tree.path_tokens(path) + [int(torch.multinomial(p, 1, generator=generator))], path
            )
        path.append(accepted)
        node = accepted


def accept_tree(
    rows: torch.Tensor,
    tree: DraftTree,
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> Acceptance:
    """What a verify step emits for one request (rows: [1 + len(tree), vocab])."""
    assert rows.shape[0] == len(tree) + 1, (rows.shape, len(tree))
    if params.is_greedy:
        return accept_greedy_tree(rows, tree)
    return accept_sampling_tree(rows, tree, params, generator)


def accept_draft(
    rows: torch.Tensor,
    draft: Sequence[int],
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> list[int]:
    """The tokens a verify step emits for a chain draft: accepted drafts, then one of the
    target's."""
    return accept_tree(rows, DraftTree.chain(draft), params, generator).tokens
