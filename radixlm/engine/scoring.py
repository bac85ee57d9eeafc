"""SGLang's scoring (`/v1/score`, `Engine.score`): for each item, the probabilities of the given
label tokens as the next token after query + item (item + query with item_first).

Each (item, label) pair is one prefill of query + item + label that asks for the prompt logprob of
its last token (max_new_tokens 0, logprob_start_len at the label): the model's own log-softmax
at the position after query + item, read where SGLang reads its token_ids_logprob. The radix cache
shares query + item among an item's labels, so each further label costs about two tokens of forward.
apply_softmax renormalizes over the labels; without it the values are the full-vocabulary
probabilities (SGLang's two modes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.ipc import GenerateReqInput


class ScoreError(ValueError):
    """A bad scoring argument; `param` names it."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ScoreResult:
    scores: list[list[float]]  # per item, in the order of label_token_ids
    prompt_tokens: int  # query + item tokens over all items (each counted once)
    cached_tokens: int = 0  # of the sequences' tokens, how many the prefix cache held


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def check_labels(label_token_ids: Any, vocab_size: int) -> list[int]:
    if label_token_ids is None:
        raise ScoreError("label_token_ids must be provided", "label_token_ids")
    if not _is_ids(label_token_ids):
        raise ScoreError("label_token_ids must be a list of token ids", "label_token_ids")
    bad = [t for t in label_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ScoreError(
            f"label_token_ids: token id {bad[0]} is out of the vocabulary (vocab size:"
            f" {vocab_size})",
            "label_token_ids",
        )
    return list(label_token_ids)


def score_prompts(
    encode: Callable[[str], list[int]], query: Any, items: Any, item_first: bool
) -> list[list[int]]:
    """Each item's prompt ids: text joined before encoding, ids joined as they are (as SGLang)."""
    if items is None:
        raise ScoreError("items must be provided", "items")
    if isinstance(query, str) and (
        isinstance(items, str)
        or (isinstance(items, list) and all(isinstance(i, str) for i in items))
    ):
        texts = [items] if isinstance(items, str) else items
        prompts = [encode(i + query if item_first else query + i) for i in texts]
    elif _is_ids(query) and isinstance(items, list) and all(_is_ids(i) for i in items):
        prompts = [i + query if item_first else query + i for i in items]
    else:
        raise ScoreError(
            "query and items must both be text (a string, and a string or a list of strings) or"
            " both token ids (a list of ids, and a list of such lists)",
            "items" if query is not None else "query",
        )
    for k, p in enumerate(prompts):
        if not p:
            raise ScoreError(
                f"query and items[{k}] are both empty: there is no position to score", "items"
            )
    return prompts


def scores_from_logprobs(logprobs: list[float], apply_softmax: bool) -> list[float]:
    if not apply_softmax:
        return [math.exp(lp) for lp in logprobs]
    top = max(logprobs, default=0.0)
    exps = [math.exp(lp - top) for lp in logprobs]
    total = sum(exps)
    return [e / total for e in exps]


async def score_request(
    tm,
    query: Any,
    items: Any,
    label_token_ids: Any,
    apply_softmax: bool = False,
    item_first: bool = False,
    admit: Callable[[int], None] | None = None,
    cache_salt: str | None = None,
) -> ScoreResult:
    """On a TokenizerManager's event loop; ScoreError (a ValueError) for bad arguments."""
    labels = check_labels(label_token_ids, tm.vocab_size)
    if isinstance(items, list) and not items:
        return ScoreResult([], 0)
    prompts = await tm.tokenizer_pool.run(
        score_prompts,
        tm.encode_prompt,
        query,
        items,
        item_first,
        what="tokenizing the score prompts",
    )
    for k, p in enumerate(prompts):
        if len(p) + 1 >= tm.context_len:  # the label takes one position more
            raise ScoreError(
                f"query + items[{k}] has {len(p)} tokens; with the label it must be shorter than"
                f" the context length {tm.context_len}",
                "items",
            )
    used = sum(len(p) for p in prompts)
    if not labels:
        return ScoreResult([[] for _ in prompts], used)
    obj = GenerateReqInput(
        input_ids=[p + [label] for p in prompts for label in labels],
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=[len(p) for p in prompts for _ in labels],
        cache_salt=cache_salt,
    )
    out = None
    async for out in tm.generate_request(obj, admit=admit):  # noqa: B007 (the last item is the result)
        pass
    outs = out if isinstance(out, list) else [out]
    # The one logprob asked for per sequence: its label's, at the position after query + item.
    lps = [o["meta_info"]["input_token_logprobs"][-1][0] for o in outs]
    n = len(labels)
    return ScoreResult(
        [
            scores_from_logprobs(lps[k * n : (k + 1) * n], apply_softmax)
            for k in range(len(prompts))
        ],
        used,
        sum(o["meta_info"].get("cached_tokens", 0) for o in outs),
    )
