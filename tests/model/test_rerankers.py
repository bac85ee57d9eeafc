"""Rerankers of both kinds through the engine (Engine.rerank: the scheduler's batch, the radix
cache) against HF transformers in float32: a BERT and an XLM-RoBERTa cross-encoder (raw logits,
tokenized as sentence-transformers' CrossEncoder does), and a Qwen3 causal LM declared a
Qwen3-Reranker with vLLM's overrides (p("yes") as its model card computes it)."""

import json

import pytest

from radixlm import Engine
from radixlm.engine.rerank import RerankError
from tests.conftest import engine_args
from tests.model.reranker_checkpoints import (
    DOCUMENTS,
    QUERY,
    QWEN3_RERANKER_OVERRIDES,
    hf_cross_encoder_logits,
    hf_qwen3_reranker_scores,
    tiny_bert_reranker,
    tiny_qwen3_reranker,
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
    assert res.prompt_tokens == sum(
        len(ids) for ids in _pair_ids(path, QUERY, DOCUMENTS)
    ), "every pair's tokens, counted once"


def _pair_ids(path, query, docs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    return [tok(query, d)["input_ids"] for d in docs]


def test_cross_encoder_needs_is_embedding(tmp_path):
    path = tiny_bert_reranker(str(tmp_path / "bert"))
    with pytest.raises(Exception, match="--is-embedding"):
        Engine(path, **engine_args())


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, default_model_path):
    from radixlm.model.loader import load_tokenizer

    path = str(tmp_path_factory.mktemp("qwen3-reranker"))
    return tiny_qwen3_reranker(path, load_tokenizer(default_model_path))


def test_qwen3_reranker_scores_equal_the_model_card(qwen3_dir):
    instruction = "Given a question, find the passage that answers it"
    want = hf_qwen3_reranker_scores(qwen3_dir, QUERY, DOCUMENTS)
    want_instructed = hf_qwen3_reranker_scores(qwen3_dir, QUERY, DOCUMENTS, instruction)
    overrides = json.dumps(QWEN3_RERANKER_OVERRIDES)
    with Engine(
        qwen3_dir, **engine_args(dtype="float32", json_model_override_args=overrides)
    ) as engine:
        res = engine.rerank(QUERY, DOCUMENTS)
        instructed = engine.rerank(QUERY, DOCUMENTS, instruct=instruction).scores()
    assert res.scores() == pytest.approx(want, abs=TOL)
    assert _order(res.scores()) == _order(want)
    assert instructed == pytest.approx(want_instructed, abs=TOL)
    assert _order(instructed) == _order(want_instructed)
    # raw: the log-odds of yes over no, whose sigmoid is p(yes)
    assert [1 / (1 + 2.718281828459045 ** -r) for r in res.raw_scores] == pytest.approx(want)


def test_a_causal_lm_without_the_overrides_is_no_reranker(qwen3_dir):
    with Engine(qwen3_dir, **engine_args(dtype="float32")) as engine:
        with pytest.raises(RerankError, match="not a reranker") as e:
            engine.rerank(QUERY, DOCUMENTS)
    assert e.value.param == "model"
