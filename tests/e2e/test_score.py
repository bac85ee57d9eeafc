"""SGLang's /v1/score and Engine.score on the tiny random Llama: each item's label probabilities
equal HF transformers' softmax over the same model's next-token logits after query + item, with
apply_softmax true (over the labels) and false (over the vocabulary); bad input is a 400 naming
its field, and the server keeps serving."""

import pytest
import requests
import torch

from radixlm import Engine
from tests.conftest import engine_args

QUERY = "Is the following city the capital of France? "
ITEMS = ["Paris", "London", "Berlin, a city in Germany"]
LABELS = [5248, 1770, 42, 9]


@pytest.fixture
def server(tiny_server):
    """The run's shared tiny-model server (tests/conftest.py), its cache flushed."""
    return tiny_server


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def hf_scores(
    hf, prompts: list[list[int]], labels: list[int], apply_softmax: bool
) -> list[list[float]]:
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = hf(torch.tensor([ids])).logits[0, -1].double()
            pick = logits[labels]
            probs = torch.softmax(pick, -1) if apply_softmax else torch.softmax(logits, -1)[labels]
            out.append(probs.tolist())
    return out


def assert_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=2e-3, abs=1e-7)


def score(server, **body):
    return requests.post(server.url + "/v1/score", json=body, timeout=120)


@pytest.mark.parametrize("apply_softmax", [True, False])
@pytest.mark.parametrize("item_first", [False, True])
def test_score_equals_hf_softmax(server, tok, tiny_hf_model, apply_softmax, item_first):
    r = score(
        server,
        query=QUERY,
        items=ITEMS,
        label_token_ids=LABELS,
        apply_softmax=apply_softmax,
        item_first=item_first,
        model="my-model",
    )
    assert r.status_code == 200, r.text
    out = r.json()
    prompts = [tok.encode(i + QUERY if item_first else QUERY + i) for i in ITEMS]
    want = hf_scores(tiny_hf_model, prompts, LABELS, apply_softmax)
    assert_close(out["scores"], want)
    assert out["object"] == "scoring" and out["model"] == "my-model"  # echoed, as SGLang does
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts)) == out["usage"]["total_tokens"]
    if apply_softmax:
        assert all(sum(s) == pytest.approx(1.0) for s in out["scores"])


def test_score_token_ids_through_the_engine(tiny_model_dir, tiny_hf_model):
    query, items = [5, 900, 77, 1203], [[44, 45], [3000], [12, 13, 14, 15]]
    with Engine(tiny_model_dir, **engine_args()) as engine:
        for apply_softmax in (True, False):
            got = engine.score(
                query=query, items=items, label_token_ids=LABELS, apply_softmax=apply_softmax
            )
            want = hf_scores(tiny_hf_model, [query + i for i in items], LABELS, apply_softmax)
            assert_close(got.scores, want)
            assert got.prompt_tokens == sum(len(query) + len(i) for i in items)
        with pytest.raises(ValueError, match="label_token_ids"):
            engine.score(query=query, items=items, label_token_ids=[10**7])


@pytest.mark.parametrize(
    "body, field",
    [
        ({"query": "q", "items": ["a"], "label_token_ids": [10**7]}, "label_token_ids"),
        ({"query": "q", "items": ["a"], "label_token_ids": [-1]}, "label_token_ids"),
        ({"query": "q", "items": ["a"], "label_token_ids": ["5"]}, "label_token_ids"),
        ({"query": "q", "items": ["a"]}, "label_token_ids"),
        ({"query": "q", "label_token_ids": [5]}, "items"),
        ({"query": "q", "items": [[1, 2]], "label_token_ids": [5]}, "items"),
        ({"query": [1, 2], "items": [[3], [10**7]], "label_token_ids": [5]}, "items"),
        (
            {"query": "q", "items": ["a"], "label_token_ids": [5], "apply_softmax": "yes"},
            "apply_softmax",
        ),
        ({"query": "q", "items": ["a"], "label_token_ids": [5], "labels": [5]}, "labels"),
        ({"query": "q", "items": ["a"] * 300, "label_token_ids": list(range(5))}, "items"),
    ],
)
def test_bad_score_requests_are_400_naming_the_field(server, body, field):
    r = score(server, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    info = requests.get(server.url + "/get_server_info", timeout=30).json()
    assert info["num_tracked_requests"] == 0  # nothing left behind
