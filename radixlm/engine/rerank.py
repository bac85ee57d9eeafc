"""Reranking (`/v1/rerank`, `Engine.rerank`): a relevance score per (query, document) pair from
a reranker model (model/reranker.py says which models are):

- a cross-encoder (BERT / XLM-RoBERTa `...ForSequenceClassification`, --is-embedding): each pair
  "[CLS] query [SEP] doc [SEP]" as the model's tokenizer makes it, one prefill-only request per
  document, all in one batch; the classifier's logit is the raw score. An encoder's requests take
  nothing from the prefix cache (the whole pair is attended both ways).
- a yes/no causal scorer (Qwen3-Reranker): each pair in the model card's template, the
  instruction and the query first, so every document's prompt starts with the same head; the
  head is prefilled once before the documents, and each document then reuses it from the radix
  cache. The score is p("yes") of the softmax over the label tokens' logits at the last position
  (engine/scoring.py reads them); its raw score the log-odds logit(yes) - logit(no).

relevance_score by default, as HF transformers and llama-server score each kind: a cross-encoder's
logit as it is (the model's output; llama-server's rank pooling), a yes/no scorer's p("yes") =
sigmoid(log-odds) (the model card's; llama-server's softmax over the labels). raw_scores (TEI's
field) gives the raw score of both: the logit, the log-odds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from radixlm.engine.scoring import score_request
from radixlm.engine.tokenizer_manager import TokenizerManager
from radixlm.ipc import EmbeddingReqInput, GenerateReqInput
from radixlm.model.reranker import CROSS_ENCODER

# The Qwen3-Reranker model card's template and default instruction.
QWEN3_RERANKER_INSTRUCT = (
    "Given a web search query, retrieve relevant passages that answer the query"
)
_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and"
    ' the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


class RerankError(ValueError):
    """A bad rerank request; `param` names the field."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.param = param


@dataclass
class RerankResult:
    raw_scores: list[float]  # per document, in the request's order
    prompt_tokens: int  # the pairs' tokens, each pair counted once
    cached_tokens: int  # of the tokens computed, how many the prefix cache held
    log_odds: bool = False  # a yes/no scorer's: its score is the probability sigmoid(raw)

    def scores(self, raw: bool = False) -> list[float]:
        if raw or not self.log_odds:
            return list(self.raw_scores)
        return [_sigmoid(s) for s in self.raw_scores]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def yes_no_parts(instruct: str | None, query: str, document: str) -> tuple[str, str, str, str]:
    """The model card's prompt in the pieces it tokenizes apart (prefix, the pair, suffix), the
    pair split before the document: joined, they are prefix + format_instruction(...) + suffix."""
    pair_head = f"<Instruct>: {instruct or QWEN3_RERANKER_INSTRUCT}\n<Query>: {query}\n"
    return _PREFIX, pair_head, f"<Document>: {document}", _SUFFIX


def _yes_no_ids(tokenizer, instruct, query, documents) -> tuple[list[int], list[list[int]]]:
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False)
    prefix, pair_head, _, suffix = yes_no_parts(instruct, query, "")
    suffix_ids = enc(suffix)
    head = enc(prefix) + enc(pair_head)
    return head, [enc(yes_no_parts(instruct, query, d)[2]) + suffix_ids for d in documents]


def _label_ids(tokenizer, tokens: list[str]) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
    bad = [t for t, i in zip(tokens, ids) if i is None or i == tokenizer.unk_token_id]
    if bad:
        raise RerankError(
            f"the model's label token {bad[0]!r} (classifier_from_token) is not in its vocabulary",
            None,
        )
    return ids


def _pair_ids(tokenizer, query: str, documents: list[str]) -> list[list[int]]:
    return [tokenizer(query, d)["input_ids"] for d in documents]


async def _prefill(tm: TokenizerManager, obj, admit) -> list[dict]:
    out: list | dict = []
    async for out in tm.generate_request(obj, admit):  # noqa: B007 (the last item is the result)
        pass
    return out if isinstance(out, list) else [out]


async def rerank(
    tm: TokenizerManager,
    query: str,
    documents: list[str],
    instruct: str | None = None,
    admit: Callable[[int], None] | None = None,
) -> RerankResult:
    """Each document's raw score (module docstring); RerankError names a bad field."""
    spec = tm.scheduler_info.get("reranker")
    if spec is None:
        raise RerankError(
            f"the served model ({tm.scheduler_info.get('architecture')}) is not a reranker:"
            " /v1/rerank needs a cross-encoder (BertForSequenceClassification,"
            " XLMRobertaForSequenceClassification, served with --is-embedding) or a yes/no"
            " reranker declared with --json-model-override-args (docs/embeddings.md, Reranking)",
            "model",
        )
    if not documents:
        return RerankResult([], 0, 0)
    tok = tm.tokenizer
    if spec["kind"] == CROSS_ENCODER:
        if instruct is not None:
            raise RerankError("a cross-encoder takes no instruction", "instruct")
        ids = await tm.tokenizer_pool.run(_pair_ids, tok, query, documents)
        for k, p in enumerate(ids):
            if len(p) > tm.context_len:
                raise RerankError(
                    f"query + documents[{k}] is {len(p)} tokens, more than the model's"
                    f" {tm.context_len}",
                    "documents",
                )
        obj = EmbeddingReqInput(input_ids=ids, sampling_params={"max_new_tokens": 0})
        metas = [o["meta_info"] for o in await _prefill(tm, obj, admit)]
        return RerankResult(
            [m["embedding"][0] for m in metas],
            sum(m["prompt_tokens"] for m in metas),
            sum(m.get("cached_tokens", 0) for m in metas),
        )
    labels = _label_ids(tok, spec["label_tokens"])
    head, tails = await tm.tokenizer_pool.run(_yes_no_ids, tok, instruct, query, documents)
    if len(head) + 1 < tm.context_len:  # (else score_request names the field)
        # The shared head once, first: every document's prompt then finds it in the radix cache.
        await _prefill(
            tm, GenerateReqInput(input_ids=head, sampling_params={"max_new_tokens": 0}), admit
        )
    res = await score_request(tm, head, tails, labels, apply_softmax=True, admit=admit)
    tiny = 1e-300  # a probability that underflowed: the log-odds stay finite
    raw = [math.log(max(s[1], tiny)) - math.log(max(s[0], tiny)) for s in res.scores]
    return RerankResult(raw, res.prompt_tokens, res.cached_tokens, log_odds=True)
