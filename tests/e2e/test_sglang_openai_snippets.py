"""SGLang's documented OpenAI-client snippets (tests/e2e/sglang_openai_snippets.py, copied from its
README and docs) run unchanged through the official `openai` client against a radixlm server:
`model="default"`
and SGLang's own example model name are served (SGLang's `model` field), greedy answers equal the
native /generate's, seeded ones the native answer with the same parameters and seed."""

from __future__ import annotations

import contextlib
import io

import openai
import pytest
import requests

from radixlm.model.loader import load_tokenizer
from radixlm.server.process import ServerProcess
from tests.e2e.sglang_openai_snippets import BY_NAME

DOCS_MODEL = "qwen/qwen2.5-0.5b-instruct"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    # The tiny random Llama (SmolLM2's tokenizer and chat template): the snippets' hundreds of
    # tokens in seconds; a short context, so that the streaming snippet (no max_tokens) ends soon.
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--context-length",
        "256",
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def ns(server):
    """The snippets' shared namespace (the docs' cells share `client`); `port` and `print_highlight`
    as the docs' notebook has them (sglang.utils prints it; here it is kept in `shown`)."""
    shown: list[str] = []
    return {"port": server.port, "print_highlight": shown.append, "shown": shown}


def run(ns: dict, name: str, server) -> str:
    """Run one snippet as published (only the README's fixed address points at this server); its
    stdout."""
    code = BY_NAME[name].code.replace(
        "http://127.0.0.1:30000/v1", f"http://127.0.0.1:{server.port}/v1"
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"<sglang snippet {name}>", "exec"), ns)
    return out.getvalue()


def native(server, text: str, **sampling) -> dict:
    r = requests.post(
        server.url + "/generate", json={"text": text, "sampling_params": sampling}, timeout=120
    )
    assert r.status_code == 200, r.text
    return r.json()


def chat_text(tokenizer, messages) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def reason(ref: dict) -> str:
    return "length" if ref["meta_info"]["finish_reason"]["type"] == "length" else "stop"


def check_completion(resp, ref: dict, model: str) -> None:
    c = resp.choices[0]
    assert resp.object == "text_completion" and resp.model == model and len(resp.choices) == 1
    assert c.text == ref["text"] and c.finish_reason == reason(ref)
    assert resp.usage.completion_tokens == ref["meta_info"]["completion_tokens"] > 0
    assert resp.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]


def check_chat(resp, ref: dict, model: str) -> None:
    c = resp.choices[0]
    assert resp.object == "chat.completion" and resp.model == model and len(resp.choices) == 1
    assert (
        c.message.role == "assistant"
        and c.message.content == ref["text"]
        and c.finish_reason == reason(ref)
    )
    assert resp.usage.completion_tokens == ref["meta_info"]["completion_tokens"] > 0


def test_readme_model_default(server, ns, tokenizer):
    printed = run(ns, "readme-completion", server)
    resp = ns["response"]
    check_completion(
        resp,
        native(server, "The capital of France is", max_new_tokens=32, temperature=0),
        "default",
    )
    assert printed.startswith("Completion(") and repr(resp.choices[0].text) in printed
    run(ns, "readme-chat", server)
    messages = [
        {"role": "system", "content": "You are a helpful AI assistant"},
        {"role": "user", "content": "List 3 countries and their capitals."},
    ]
    check_chat(
        ns["response"],
        native(server, chat_text(tokenizer, messages), max_new_tokens=64, temperature=0),
        "default",
    )


def test_docs_snippets(server, ns, tokenizer):
    run(ns, "docs-chat", server)
    messages = [{"role": "user", "content": "List 3 countries and their capitals."}]
    check_chat(
        ns["response"],
        native(server, chat_text(tokenizer, messages), max_new_tokens=64, temperature=0),
        DOCS_MODEL,
    )
    assert ns["shown"][-1] == f"Response: {ns['response']}"

    # Qwen2.5's token ids: 67890 is past this tokenizer's 49,152-token vocabulary, a 400 naming it
    # (as vLLM).
    assert 12345 < len(tokenizer) <= 67890
    for name in ("docs-chat-logit-bias", "docs-completion-logit-bias"):
        with pytest.raises(openai.BadRequestError, match="logit_bias.*67890") as e:
            run(ns, name, server)
        assert e.value.status_code == 400 and e.value.body["param"] == "logit_bias"

    run(ns, "docs-chat-parameters", server)
    messages = [
        {
            "role": "system",
            "content": "You are a knowledgeable historian who provides concise responses.",
        },
        {"role": "user", "content": "Tell me about ancient Rome"},
        {"role": "assistant", "content": "Ancient Rome was a civilization centered in Italy."},
        {"role": "user", "content": "What were their major achievements?"},
    ]
    check_chat(
        ns["response"],
        native(
            server,
            chat_text(tokenizer, messages),
            max_new_tokens=128,
            temperature=0.3,
            top_p=0.95,
            presence_penalty=0.2,
            frequency_penalty=0.2,
            seed=42,
        ),
        DOCS_MODEL,
    )
    assert ns["shown"][-1] == ns["response"].choices[0].message.content

    printed = run(ns, "docs-chat-stream", server)
    last = ns["chunk"]  # the loop's last chunk: the finish
    assert printed and last.model == DOCS_MODEL and last.object == "chat.completion.chunk"
    assert last.choices[0].finish_reason in ("stop", "length") and last.choices[
        0
    ].delta.content in (None, "")

    run(ns, "docs-completion", server)
    check_completion(
        ns["response"],
        native(server, "List 3 countries and their capitals.", max_new_tokens=64, temperature=0),
        DOCS_MODEL,
    )

    run(ns, "docs-completion-parameters", server)
    ref = native(
        server,
        "Write a short story about a space explorer.",
        max_new_tokens=150,
        temperature=0.7,
        top_p=0.9,
        stop=["\n\n", "THE END"],
        presence_penalty=0.3,
        frequency_penalty=0.3,
        seed=123,
    )
    check_completion(ns["response"], ref, DOCS_MODEL)
    assert ns["shown"][-1] == f"Response: {ns['response']}"


def test_docs_lora_adapter_syntax(server, ns):
    if "client" not in ns:
        run(ns, "docs-chat", server)
    with pytest.raises(openai.NotFoundError, match="adapter_a") as e:
        run(ns, "docs-lora-model-adapter", server)
    assert e.value.status_code == 404 and e.value.body["param"] == "model"
    # The base name alone is served, as SGLang serves it.
    ok = ns["client"].chat.completions.create(
        model=DOCS_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert ok.model == DOCS_MODEL and ok.usage.completion_tokens >= 1
