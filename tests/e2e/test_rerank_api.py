"""/v1/rerank (and /rerank) over HTTP on tiny random rerankers of both kinds, against HF
transformers in float32: a Qwen3 causal LM declared a Qwen3-Reranker with vLLM's overrides
(--json-model-override-args; p("yes") as the model card computes it), a BERT cross-encoder
(--is-embedding; its logit, as HF's model and llama-server give it). Also: top_n,
return_documents, the query's prefix reused from the radix cache across documents, 400s naming
the field, and a model that is no reranker."""

import json
import math

import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.model.reranker_checkpoints import (
    CARD_INSTRUCTION,
    CARD_PREFIX,
    DOCUMENTS,
    QUERY,
    QWEN3_RERANKER_OVERRIDES,
    hf_cross_encoder_logits,
    hf_qwen3_reranker_scores,
    tiny_bert_reranker,
    tiny_qwen3_reranker,
)

SERVE = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--dtype", "float32")
SERVE += ("--quantization", "none", "--enable-invariant-checks")
TOL = 1e-4


def _order(scores):
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, default_model_path):
    from radixlm.model.loader import load_tokenizer

    path = str(tmp_path_factory.mktemp("qwen3-reranker"))
    return tiny_qwen3_reranker(path, load_tokenizer(default_model_path))


@pytest.fixture(scope="module")
def qwen3_server(qwen3_dir):
    overrides = json.dumps(QWEN3_RERANKER_OVERRIDES)
    s = ServerProcess("--model-path", qwen3_dir, "--json-model-override-args", overrides, *SERVE)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return tiny_bert_reranker(str(tmp_path_factory.mktemp("bert-reranker")))


@pytest.fixture(scope="module")
def bert_server(bert_dir):
    # Chunks of 4 tokens for the others: an encoder's pairs are still read whole.
    s = ServerProcess(
        "--model-path", bert_dir, "--is-embedding", "--chunked-prefill-size", "4", *SERVE
    )
    yield s
    s.stop()


def _rerank(server, path="/v1/rerank", **body):
    return requests.post(server.url + path, json=body, timeout=60)


def test_qwen3_reranker_orders_as_the_model_card(qwen3_server, qwen3_dir):
    want = hf_qwen3_reranker_scores(qwen3_dir, QUERY, DOCUMENTS)
    r = _rerank(qwen3_server, model="reranker", query=QUERY, documents=DOCUMENTS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "reranker"
    results = body["results"]
    assert [x["index"] for x in results] == _order(want)
    for x in results:
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=TOL)
        assert "document" not in x  # return_documents defaults to false (Cohere's)


def test_an_instruction_replaces_the_default(qwen3_server, qwen3_dir):
    instruction = "Given a question, find the passage that answers it"
    want = hf_qwen3_reranker_scores(qwen3_dir, QUERY, DOCUMENTS, instruction)
    r = _rerank(qwen3_server, query=QUERY, documents=DOCUMENTS, instruct=instruction)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == _order(want)
    assert [x["relevance_score"] for x in results] == pytest.approx(
        [want[x["index"]] for x in results], abs=TOL
    )
    raw = _rerank(qwen3_server, query=QUERY, documents=DOCUMENTS, raw_scores=True).json()
    default = hf_qwen3_reranker_scores(qwen3_dir, QUERY, DOCUMENTS)
    # raw_scores: the log-odds of "yes" over "no"
    assert {x["index"]: x["relevance_score"] for x in raw["results"]} == pytest.approx(
        {i: math.log(p / (1 - p)) for i, p in enumerate(default)}, abs=TOL
    )


def test_query_prefix_is_reused_across_documents(qwen3_server, qwen3_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    query = "which city is the capital of germany?"
    head = CARD_PREFIX + f"<Instruct>: {CARD_INSTRUCTION}\n<Query>: {query}\n"
    head_len = len(tok.encode(head, add_special_tokens=False))
    assert requests.post(qwen3_server.url + "/flush_cache", timeout=30).status_code == 200
    docs = ["berlin is the capital of germany", "paris is in france", "cats are pets"]
    r = _rerank(qwen3_server, query=query, documents=docs)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    # Each document's two label sequences find at least the query's head in the cache.
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 2 * len(docs) * head_len
    pair_tokens = [
        len(tok.encode(head + f"<Document>: {d}", add_special_tokens=False)) for d in docs
    ]
    assert usage["prompt_tokens"] >= sum(pair_tokens)
    assert usage["total_tokens"] == usage["prompt_tokens"]


def test_top_n_and_return_documents(qwen3_server, qwen3_dir):
    want = hf_qwen3_reranker_scores(qwen3_dir, QUERY, DOCUMENTS)
    docs = [{"text": d} for d in DOCUMENTS]  # Cohere v2's / Jina's object form
    r = _rerank(
        qwen3_server, "/rerank", query=QUERY, documents=docs, top_n=2, return_documents=True
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == _order(want)[:2]
    assert [x["document"] for x in results] == [{"text": DOCUMENTS[i]} for i in _order(want)[:2]]


def test_bert_cross_encoder_orders_as_hf(bert_server, bert_dir):
    logits = hf_cross_encoder_logits(bert_dir, QUERY, DOCUMENTS)
    r = _rerank(bert_server, query=QUERY, documents=DOCUMENTS, return_documents=True)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == _order(logits)
    for x in results:  # the classifier's logit, as HF's model gives it (and llama-server)
        assert x["relevance_score"] == pytest.approx(logits[x["index"]], abs=TOL)
        assert x["document"] == {"text": DOCUMENTS[x["index"]]}
    raw = _rerank(bert_server, query=QUERY, documents=DOCUMENTS, raw_scores=True).json()
    assert {x["index"]: x["relevance_score"] for x in raw["results"]} == pytest.approx(
        dict(enumerate(logits)), abs=TOL
    )
    # A cross-encoder has no embeddings to give.
    e = requests.post(bert_server.url + "/v1/embeddings", json={"input": "hi"}, timeout=30)
    assert e.status_code == 400 and "/v1/rerank" in e.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"documents": ["a"]}, "query"),
        ({"query": "", "documents": ["a"]}, "query"),
        ({"query": 5, "documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q"}, "documents"),
        ({"query": "q", "documents": "a"}, "documents"),
        ({"query": "q", "documents": ["a", 3]}, "documents[1]"),
        ({"query": "q", "documents": [{"txt": "a"}]}, "documents[0]"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
        ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
        ({"query": "q", "documents": ["a"], "bogus": 1}, "bogus"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(qwen3_server, body, param):
    r = _rerank(qwen3_server, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_cross_encoder_refuses_an_instruction(bert_server):
    r = _rerank(bert_server, query=QUERY, documents=DOCUMENTS, instruct="judge relevance")
    assert r.status_code == 400 and r.json()["error"]["param"] == "instruct", r.text


def test_a_model_that_is_no_reranker_is_a_400(qwen3_dir):
    s = ServerProcess("--model-path", qwen3_dir, *SERVE)  # no overrides: a plain causal LM
    try:
        r = _rerank(s, query=QUERY, documents=DOCUMENTS)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "model" and "not a reranker" in err["message"]
        # ... and the server keeps serving.
        g = requests.post(
            s.url + "/generate",
            json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
            timeout=60,
        )
        assert g.status_code == 200 and g.json()["meta_info"]["completion_tokens"] == 2
    finally:
        s.stop()
