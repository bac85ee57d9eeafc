"""DRY ("don't repeat yourself"), llama.cpp's repetition penalty, for one request.

A token that would extend a sequence already seen in the context (the prompt and the output so
far, at most dry_penalty_last_n tokens back) by more than dry_allowed_length tokens gets its logit
lowered by dry_multiplier * dry_base ** (repeat length - dry_allowed_length). Sequence breakers
(a newline, a colon, ...) end repeats: only the tokens after the last breaker count, and a token
that is a breaker itself is never penalized. Same definition as llama.cpp's src/llama-sampling.cpp
(llama_sampler_dry_apply); the repeat lengths are computed here by vectorized candidate matching.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from radixlm.sampling_params import SamplingParams

# pow(base, exponent) is clamped below float32's largest value, as llama.cpp does.
_FLOAT_MAX_LOG = 88.7228391
# Candidate matching extends all candidate positions one token per numpy pass; a repeat longer
# than this (a degenerate context) switches to the linear Z-algorithm instead.
_MAX_PASSES = 64


def dry_penalties(
    context: Sequence[int],
    sp: SamplingParams,
    single: frozenset = frozenset(),
    multi: Mapping[int, Sequence[Sequence[int]]] | None = None,
) -> dict[int, float]:
    """token id -> the amount to subtract from its logit. single: tokens that are a breaker on their
    own; multi: head token -> tails that complete a breaker after it."""
    last_n = (
        len(context) if sp.dry_penalty_last_n == -1 else min(len(context), sp.dry_penalty_last_n)
    )
    allowed = sp.dry_allowed_length
    if last_n <= allowed:
        return {}
    win = context[len(context) - last_n :]
    cap = _repeat_limit(win, single, multi or {})
    if cap < allowed:
        return {}
    longest: dict[int, int] = {}
    for j, length in _repeats(np.asarray(win, dtype=np.int64), cap, allowed):
        tok = int(win[j + 1])  # emitting it again would extend the repeat that ends at j
        if length > longest.get(tok, -1):
            longest[tok] = length
    max_exp = int(_FLOAT_MAX_LOG / math.log(sp.dry_base)) if sp.dry_base > 1.000001 else 0
    out = {}
    for tok, length in longest.items():
        if tok in single:
            continue
        exp = length - allowed
        if max_exp > 0:
            exp = min(exp, max_exp)
        out[tok] = sp.dry_multiplier * sp.dry_base**exp
    return out


def _repeat_limit(win: Sequence[int], single: frozenset, multi: Mapping) -> int:
    """Tokens after the last complete breaker in the window (all of them without one)."""
    n = len(win)
    for i in range(n):  # i: distance from the end
        tok = win[n - 1 - i]
        best = 0 if tok in single else -1  # the longest breaker that starts here
        for tail in multi.get(tok, ()):
            k = len(tail)
            if best < k <= i and all(tail[o] == win[n - i + o] for o in range(k)):
                best = k
        if best >= 0:
            return i - best
    return n


def _repeats(win: np.ndarray, cap: int, need: int) -> list[tuple[int, int]]:
    """(j, min(L, cap)) for each position j < n - 1 whose tokens ending at j repeat the window's
    last L tokens (L the longest such length), where that is >= need."""
    n = len(win)
    cand = np.flatnonzero(win[:-1] == win[-1])  # L >= 1: candidates, extended one token per pass
    out: list[tuple[int, int]] = []
    m = 1
    while cand.size and m < cap:
        if m > _MAX_PASSES:
            z = _suffix_matches(win.tolist())
            return [(j, min(z[j], cap)) for j in range(n - 1) if min(z[j], cap) >= need]
        ok = cand >= m
        ok[ok] = win[cand[ok] - m] == win[n - 1 - m]
        if m >= need:
            out.extend((int(j), m) for j in cand[~ok])
        cand = cand[ok]
        m += 1
    if m >= need:
        out.extend((int(j), m) for j in cand)
    return out


def _suffix_matches(seq: list[int]) -> list[int]:
    """For each j: the longest L with seq[j-L+1 .. j] == seq[n-L .. n-1] (the Z-algorithm on the
    reversed sequence, linear time)."""
    r = seq[::-1]
    n = len(r)
    z = [0] * n
    lt = rt = 0
    for k in range(1, n):
        if k < rt:
            z[k] = min(rt - k, z[k - lt])
        while k + z[k] < n and r[z[k]] == r[k + z[k]]:
            z[k] += 1
        if k + z[k] > rt:
            lt, rt = k, k + z[k]
    return [z[n - 1 - j] for j in range(n)]
