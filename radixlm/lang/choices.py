"""How `select` picks among scored choices. Each method takes, per choice, the logprobs of the
choice's own tokens (conditioned on the prompt) and returns (index, meta)."""

from __future__ import annotations

import math
from collections.abc import Callable


def _mean(xs: list) -> float:
    return sum(xs) / len(xs) if xs else -math.inf


def _argmax(xs: list) -> int:
    return max(range(len(xs)), key=lambda i: xs[i])


class ChoicesMethod:
    needs_unconditional = False

    def __call__(
        self, choices: list, logprobs: list[list[float]], unconditional: list | None = None
    ):
        raise NotImplementedError


class TokenLengthNormalized(ChoicesMethod):
    """Highest mean logprob over the choice's tokens (SGLang's default)."""

    def __call__(self, choices, logprobs, unconditional=None):
        scores = [_mean(lp) for lp in logprobs]
        return _argmax(scores), {"normalized_prompt_logprobs": scores}


class GreedyTokenSelection(ChoicesMethod):
    """Compare choices token by token as greedy decoding would: highest first-token logprob
    wins, ties go to the next token; a shorter choice is padded with its own mean."""

    def __call__(self, choices, logprobs, unconditional=None):
        width = max((len(lp) for lp in logprobs), default=0)
        padded = [lp + [_mean(lp)] * (width - len(lp)) for lp in logprobs]
        best = max(range(len(choices)), key=lambda i: tuple(padded[i]))
        return best, {
            "normalized_prompt_logprobs": [_mean(lp) for lp in logprobs],
            "greedy_logprobs": padded,
        }


class UnconditionalLikelihoodNormalized(ChoicesMethod):
    """Highest mean of (conditional - unconditional) logprob over the choice's tokens: corrects
    for choices that are likely whatever the question."""

    needs_unconditional = True

    def __call__(self, choices, logprobs, unconditional=None):
        scores = []
        for lp, un in zip(logprobs, unconditional):
            k = min(len(lp), len(un))
            scores.append(
                _mean([a - b for a, b in zip(lp[len(lp) - k :], un[len(un) - k :])])
                if k
                else -math.inf
            )
        return _argmax(scores), {
            "normalized_prompt_logprobs": [_mean(lp) for lp in logprobs],
            "unconditional_normalized_logprobs": scores,
        }


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()

_BY_NAME: dict[str, Callable] = {
    "token_length_normalized": token_length_normalized,
    "greedy_token_selection": greedy_token_selection,
    "unconditional_likelihood_normalized": unconditional_likelihood_normalized,
}


def resolve(method) -> ChoicesMethod:
    if method is None:
        return token_length_normalized
    if isinstance(method, str):
        return _BY_NAME[method]
    return method
