"""The OpenAI routes' `model` field under --strict-model-name (vLLM's check): the served name, the
model's path or nothing is served, any other name is a 404 naming it; by default any name is served,
as SGLang (tests/e2e/test_sglang_openai_snippets.py)."""

from __future__ import annotations

import openai
import pytest
import requests

from radixlm.server.process import ServerProcess

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def strict(tiny_model_dir):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--served-model-name",
        "tiny",
        "--strict-model-name",
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
    )
    yield s
    s.stop()


def test_strict_model_name(strict, tiny_model_dir):
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key="x", max_retries=0, timeout=60)
    ref = requests.post(
        strict.url + "/generate",
        json={"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
        timeout=60,
    ).json()
    for name in ("tiny", tiny_model_dir):
        out = client.completions.create(model=name, prompt=PROMPT, max_tokens=8, temperature=0)
        assert out.choices[0].text == ref["text"] and out.model == name
    no_model = requests.post(
        strict.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0},
        timeout=60,
    ).json()
    assert no_model["choices"][0]["text"] == ref["text"] and no_model["model"] == "tiny"
    for name, needle in (
        ("default", "The model 'default' does not exist; this server serves 'tiny'"),
        ("gpt-4o:sql", "The model 'gpt-4o' does not exist"),
        ("tiny:sql", "The LoRA adapter 'sql'"),
    ):
        with pytest.raises(openai.NotFoundError, match=needle) as e:
            client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
        assert e.value.body["param"] == "model" and e.value.body["code"] == 404
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert requests.get(strict.url + "/health", timeout=10).status_code == 200
