"""Cross-encoder rerankers through the engine (Engine.rerank: the scheduler's batch) against HF
transformers in float32: a BERT and an XLM-RoBERTa `...ForSequenceClassification` (raw logits,
pairs tokenized as sentence-transformers' CrossEncoder does). The yes/no kind (Qwen3-Reranker)
against its model card's scoring: tests/e2e/test_rerank_api.py."""

import pytest

from radixlm import Engine
from radixlm.engine.rerank import RerankError
from tests.conftest import engine_args
from tests.model.reranker_checkpoints import (
    DOCUMENTS,
    QUERY,
    hf_cross_encoder_logits,
    tiny_bert_reranker,
    tiny_xlm_roberta_reranker,
)

TOL = 1e-4


def _order(scores):
    return sorted(range(len(scores)), key=lambda i: -scores[i])


@pytest.mark.parametrize("build", [tiny_bert_reranker, tiny_xlm_roberta_reranker])
def test_cross_encoder_logits_equal_hf(tmp_path, build):
    path = build(str(tmp_path / "ce"))
    want = hf_cross_encoder_logits(path, QUERY, DOCUMENTS)
    with Engine(path, **engine_args(is_embedding=True, dtype="float32")) as engine:
        res = engine.rerank(QUERY, DOCUMENTS)
        # One document alone scores as in the batch (each pair attends to itself only).
        alone = engine.rerank(QUERY, DOCUMENTS[1:2]).raw_scores
        with pytest.raises(RerankError) as e:
            engine.rerank(QUERY, DOCUMENTS, instruct="judge")
        assert e.value.param == "instruct"
        with pytest.raises(ValueError, match="/v1/rerank"):
            engine.encode("a cross-encoder has no embeddings")
    assert res.raw_scores == pytest.approx(want, abs=TOL)
    assert _order(res.raw_scores) == _order(want)
    assert alone == pytest.approx(want[1:2], abs=TOL)
    assert res.prompt_tokens == sum(len(ids) for ids in _pair_ids(path, QUERY, DOCUMENTS)), (
        "every pair's tokens, counted once"
    )


def _pair_ids(path, query, docs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return [tok(query, d)["input_ids"] for d in docs]


def test_cross_encoder_needs_is_embedding(tmp_path):
    path = tiny_bert_reranker(str(tmp_path / "bert"))
    with pytest.raises(Exception, match="--is-embedding"):
        Engine(path, **engine_args())
