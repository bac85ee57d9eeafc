"""Naive references of the extra samplers (llama.cpp's and vLLM's definitions written out plainly),
shared by the sampler's unit tests and the end-to-end tests."""

import math


def ref_dry(context, sp, single=frozenset(), multi=None):
    """llama.cpp's DRY, quadratic and literal."""
    multi = multi or {}
    n = len(context) if sp.dry_penalty_last_n == -1 else min(len(context), sp.dry_penalty_last_n)
    if n <= sp.dry_allowed_length:
        return {}
    w = list(context[len(context) - n :])

    def breaker_len(h):  # the longest breaker starting at h that fits the window, or None
        lens = [0] if w[h] in single else []
        lens += [
            len(t) for t in multi.get(w[h], ()) if tuple(w[h + 1 : h + 1 + len(t)]) == tuple(t)
        ]
        return max(lens) if lens else None

    heads = [h for h in range(n) if breaker_len(h) is not None]
    limit = n - 1 - heads[-1] - breaker_len(heads[-1]) if heads else n
    if limit < sp.dry_allowed_length:
        return {}
    longest = {}
    for j in range(n - 1):
        m = 0
        while m <= j and m < limit and w[j - m] == w[n - 1 - m]:
            m += 1
        if m >= sp.dry_allowed_length:
            longest[w[j + 1]] = max(longest.get(w[j + 1], 0), m)
    max_exp = int(88.7228391 / math.log(sp.dry_base)) if sp.dry_base > 1.000001 else None
    out = {}
    for tok, m in longest.items():
        if tok not in single:
            e = m - sp.dry_allowed_length
            out[tok] = sp.dry_multiplier * sp.dry_base ** (min(e, max_exp) if max_exp else e)
    return out


def ref_bad_word_bans(words, out):
    """vLLM's rule: ban a word's last token when the output ends with the rest of it."""
    return {
        w[-1]
        for w in words
        if len(w) - 1 <= len(out) and list(out[len(out) - len(w) + 1 :]) == list(w[:-1])
    }


def vllm_bad_word_forms(tokenizer, word):
    """vLLM's SamplingParams.update_from_tokenizer for one word: its tokens, and those of " word"
    when they start with another token and have as many."""
    forms = [tokenizer.encode(word.lstrip(), add_special_tokens=False)]
    spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
    if spaced[0] != forms[0][0] and len(spaced) == len(forms[0]):
        forms.append(spaced)
    return [tuple(f) for f in forms]
