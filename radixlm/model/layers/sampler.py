"""Batched sampling on tensors: penalties, temperature, top-k / top-p / min-p, per-request seeds
(and, when a row asks for one, the extra samplers of sampler_extras.py).

Sampling uses the exponential race (argmax p_i / E_i, E_i ~ Exp(1)), which is exact
categorical sampling and lets each seeded request draw its noise from its own
generator while the batch stays one tensor op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from radixlm.kernels.ops import cpu_float_ops
from radixlm.model.host_copy import to_device
from radixlm.model.layers.sampler_extras import ExtraSampling
from radixlm.sampling_params import SamplingParams


@dataclass(frozen=True)
class SamplingRow:
    """What the sampler needs of one request in a step."""

    params: SamplingParams
    output_ids: Sequence[int] = ()  # frequency / presence / repetition penalties
    prompt_ids: Sequence[int] = ()  # repetition penalty
    # The request's seeded generator (None: the global one; also for a row whose sample is dropped,
    # which must not consume a seeded request's draws).
    generator: torch.Generator | None = field(default=None, compare=False)
    banned_ids: Sequence[int] = ()  # at -inf this step (EOS and stop tokens before min_new_tokens)


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # [bs, 1], 1.0 for greedy rows (unused there)
    top_ps: torch.Tensor  # [bs]
    top_ks: torch.Tensor  # [bs], vocab size for "all"
    min_ps: torch.Tensor  # [bs]
    greedy: torch.Tensor  # [bs] bool
    is_all_greedy: bool
    need_top_p: bool
    need_top_k: bool
    need_min_p: bool
    # Penalties: None when no request in the batch uses them.
    frequency_penalties: torch.Tensor | None  # [bs, 1]
    presence_penalties: torch.Tensor | None  # [bs, 1]
    repetition_penalties: torch.Tensor | None  # [bs, 1]
    output_counts: torch.Tensor | None  # [bs, vocab] counts of generated tokens
    seen_mask: torch.Tensor | None  # [bs, vocab] prompt or output token seen (repetition penalty)
    # [bs, vocab] added to the logits: logit_bias, and -inf for tokens banned this step (EOS before
    # min_new_tokens). None when no request has either.
    vocab_mask: torch.Tensor | None
    generators: list[torch.Generator | None]
    extras: ExtraSampling | None = (
        None  # typical_p, bad_words, allowed_token_ids, DRY, XTC: None when unused
    )
    max_top_k: int = (
        0  # the largest top_ks entry (a host copy: reading it back would wait for the device)
    )
    # top-p may sort only the top candidates when they hold every row's nucleus: deciding that reads
    # a value back, cheap on a CPU; on a GPU the whole row is sorted instead (no host sync).
    partial_sort: bool = True

    @classmethod
    def build(
        cls, rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
    ) -> SamplingBatchInfo:
        params = [r.params for r in rows]
        output_ids = [r.output_ids for r in rows]
        prompt_ids = [r.prompt_ids for r in rows]
        banned_ids = [r.banned_ids for r in rows]
        bs = len(params)
        greedy = [p.is_greedy for p in params]
        temps = [1.0 if g else p.temperature for p, g in zip(params, greedy)]
        top_ks = [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params]
        f = lambda xs, dt=torch.float32: to_device(xs, dt, device)

        freq = [p.frequency_penalty for p in params]
        pres = [p.presence_penalty for p in params]
        rep = [p.repetition_penalty for p in params]
        use_fp = any(freq) or any(pres)
        use_rep = any(r != 1.0 for r in rep)
        counts = seen = None
        if use_fp or use_rep:
            counts = torch.zeros((bs, vocab_size), dtype=torch.float32, device=device)
            for i, ids in enumerate(output_ids):
                if ids:
                    idx = f(ids, torch.int64)
                    counts[i].scatter_add_(0, idx, torch.ones_like(idx, dtype=torch.float32))
        if use_rep:
            seen = counts > 0
            for i, ids in enumerate(prompt_ids):
                if rep[i] != 1.0 and ids:
                    seen[i, f(ids, torch.int64)] = True
        extras = None
        if any(p.uses_extra_samplers for p in params):
            extras = ExtraSampling.build(
                params, output_ids, prompt_ids, [r.generator for r in rows], greedy, device
            )
        vocab_mask = None
        if (
            any(banned_ids)
            or any(p.logit_bias for p in params)
            or (extras is not None and extras.masks)
        ):
            vocab_mask = torch.zeros((bs, vocab_size), dtype=torch.float32, device=device)
            for i, p in enumerate(params):
                if p.logit_bias:
                    ids = f([int(t) for t in p.logit_bias], torch.int64)
                    vocab_mask[i, ids] = f([float(b) for b in p.logit_bias.values()])
            for i, ids in enumerate(banned_ids):
                if ids:
                    vocab_mask[i, f(ids, torch.int64)] = float("-inf")
            if extras is not None:
                extras.fill_mask(vocab_mask)
        return cls(
            temperatures=f(temps).unsqueeze(1),
            top_ps=f([p.top_p for p in params]),
            top_ks=f(top_ks, torch.int64),
            min_ps=f([p.min_p for p in params]),
            greedy=f(greedy, torch.bool),
            is_all_greedy=all(greedy),
            need_top_p=any(p.top_p < 1.0 and not g for p, g in zip(params, greedy)),
            need_top_k=any(k < vocab_size and not g for k, g in zip(top_ks, greedy)),
            need_min_p=any(p.min_p > 0 and not g for p, g in zip(params, greedy)),
            frequency_penalties=f(freq).unsqueeze(1) if use_fp else None,
            presence_penalties=f(pres).unsqueeze(1) if use_fp else None,
            repetition_penalties=f(rep).unsqueeze(1) if use_rep else None,
            output_counts=counts,
            seen_mask=seen,
            vocab_mask=vocab_mask,
            generators=[r.generator for r in rows],
            extras=extras,
            max_top_k=max(top_ks, default=0),
            partial_sort=torch.device(device).type == "cpu",
        )


def apply_penalties(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    if info.repetition_penalties is not None:
        # HF / CTRL style: divide positive logits, multiply negative ones, for seen tokens.
        pen = info.repetition_penalties
        penalized = torch.where(logits > 0, logits / pen, logits * pen)
        logits = torch.where(info.seen_mask, penalized, logits)
    if info.frequency_penalties is not None:
        counts = info.output_counts
        logits = (
            logits
            - info.frequency_penalties * counts
            - info.presence_penalties * (counts > 0).float()
        )
    if info.vocab_mask is not None:
        logits = logits + info.vocab_mask
    if info.extras is not None:
        logits = info.extras.penalize(logits)
    return logits


def _exponential_noise(
    shape: tuple[int, int], gens: list[torch.Generator | None], device
) -> torch.Tensor:
    bs, vocab = shape
    u = torch.empty(shape, dtype=torch.float32, device=device)
    seeded = [i for i, g in enumerate(gens) if g is not None]
    if len(seeded) < bs:
        u.uniform_()
    for i in seeded:  # per-request CPU generators: the same draws on any device
        u[i] = to_device(torch.rand(vocab, generator=gens[i]), torch.float32, device)
    return -torch.log(u.clamp_(min=1e-20))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for [rows, vocab]: the native op on CPU float32 (torch's scans one
    element at a time on one thread: ~210 us for a 248k vocabulary; kernels/csrc/argmax.cpp)."""
    ops = cpu_float_ops(x) if x.dim() == 2 and x.shape[1] > 0 else None
    return ops.argmax_rows(x) if ops is not None else torch.argmax(x, dim=-1)


class Sampler:
    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """logits [bs, vocab] float32 (raw model logits) -> next token ids [bs]."""
        logits = apply_penalties(logits, info)
        greedy_ids = argmax_rows(logits)
        if info.is_all_greedy:
            return greedy_ids
        probs = sampling_probs(logits, info)
        noise = _exponential_noise(tuple(probs.shape), info.generators, probs.device)
        sampled = argmax_rows(probs / noise)
        return torch.where(info.greedy, greedy_ids, sampled)


def sampling_probs(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """The (unnormalized) distribution a sampled row draws from, given its penalized logits:
    temperature, top-k / top-p / min-p, then the extra filters (typical_p, XTC)."""
    probs = torch.softmax(logits / info.temperatures, dim=-1)
    if info.need_top_k or info.need_top_p or info.need_min_p:
        probs = top_k_top_p_min_p(probs, info)
    if info.extras is not None:
        probs = info.extras.filter(probs)
    return probs


# top-p without a top-k sorts only this many candidates when their mass covers every row's nucleus
# (a 150k-entry sort per row costs milliseconds on a CPU); otherwise the whole row is sorted.
TOP_P_CANDIDATES = 1024


def top_k_top_p_min_p(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """probs with the tokens outside top-k, top-p (smallest prefix reaching top_p of the top-k's
    mass, the crossing token kept: HF's and vLLM's top-p after top-k) and min-p zeroed. Only the
    candidates that can survive are sorted: the top k (topk is a partial sort), the top
    TOP_P_CANDIDATES when they hold every row's nucleus, none for min-p alone."""
    vocab = probs.shape[-1]
    k_max = info.max_top_k
    if not info.need_top_k and not info.need_top_p:  # min-p alone: a threshold, no order needed
        return probs.masked_fill(
            probs < probs.amax(-1, keepdim=True) * info.min_ps.unsqueeze(1), 0.0
        )
    cand = (
        k_max
        if not info.need_top_p
        else min(vocab, max(TOP_P_CANDIDATES, k_max if k_max < vocab else 0))
    )
    if cand < vocab and (info.partial_sort or not info.need_top_p):
        vals, order = torch.topk(probs, cand, dim=-1)
        # Exact when no row keeps a token past the candidates: its top-k is within them (always, for
        # top-k alone), or its nucleus is (their mass passes top_p, so every later token has
        # cum_before > top_p). (A top-k past the candidates but short of the vocabulary needs its
        # own mass: full sort.)
        covered = not info.need_top_p or bool(
            (
                (info.top_ks <= cand)
                | ((info.top_ks >= vocab) & (info.top_ps < 1) & (vals.sum(-1) > info.top_ps))
            ).all()
        )
        if covered:
            return torch.zeros_like(probs).scatter_(-1, order, _filter_sorted(vals, info, probs))
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    return torch.zeros_like(probs).scatter_(-1, order, _filter_sorted(sorted_p, info, probs))


def _filter_sorted(
    sorted_p: torch.Tensor, info: SamplingBatchInfo, probs: torch.Tensor
) -> torch.Tensor:
    """The filters on probabilities sorted descending (a prefix of each row's order, holding its
    top-k; a row without top-k takes the whole row's mass for top-p)."""
    ranks = torch.arange(sorted_p.shape[-1], device=sorted_p.device).unsqueeze(0)
    in_k = ranks < info.top_ks.unsqueeze(1)
    drop = ~in_k
    if info.need_top_p:
        # Keep the smallest prefix reaching top_p of the top-k's mass (the token crossing it stays).
        whole = info.top_ks >= probs.shape[-1]
        mass = torch.where(whole, probs.sum(-1), (sorted_p * in_k).sum(-1))
        cum_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        drop |= cum_before > (info.top_ps * mass).unsqueeze(1)
    if info.need_min_p:
        drop |= sorted_p < (sorted_p[:, :1] * info.min_ps.unsqueeze(1))
    return sorted_p.masked_fill(drop, 0.0)
