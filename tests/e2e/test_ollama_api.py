"""Ollama's API (/api/*) through the official `ollama` client, against radixlm's own answers on the
same server: raw generate = /generate's greedy text, templated generate and chat = the OpenAI chat
route's greedy answer (and its prompt and output token ids for generate's `context`), tool calls =
the chat route's, thinking = the chat route's reasoning_content (a --reasoning-parser server),
embeddings = /v1/embeddings' (an --is-embedding server); JSON output checked with `jsonschema`;
errors in Ollama's {"error": ...} shape with the field named."""

import json

import jsonschema
import ollama
import openai
import pytest
import requests

from radixlm.server.process import ServerProcess
from radixlm.version import __version__
from tests.conftest import TINY_SERVE

SYSTEM = "You are a helpful assistant. Answer briefly."
USER = "What is the capital of France?"
GREEDY = {"temperature": 0, "num_predict": 16}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def server():
    s = ServerProcess()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(oai):
    return oai.models.list().data[0].id


@pytest.fixture(scope="module")
def name(served):
    return served + ":latest"


def chat_route(server, messages, max_tokens=16, **extra):
    """The OpenAI chat route's greedy answer, with its prompt and output token ids."""
    r = requests.post(
        server.url + "/v1/chat/completions",
        json={
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
            **extra,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0], body["prompt_token_ids"]


def test_models_list_show_ps_version(server, client, oai, served, name):
    listed = client.list().models
    assert [m.model for m in listed] == [name] and listed[0].details.format == "gguf"
    card = oai.models.list().data[0]
    shown = client.show(name)
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    family = shown.details.family
    assert shown.modelinfo[f"{family}.context_length"] == card.model_extra["max_model_len"]
    assert client.show(served).details == shown.details  # the tag is optional
    running = client.ps().models
    assert [m.model for m in running] == [name]
    assert running[0].context_length == card.model_extra["max_model_len"]
    assert running[0].size == listed[0].size > 0 and running[0].size_vram > running[0].size
    assert requests.get(server.url + "/api/version", timeout=30).json() == {"version": __version__}
    # Nothing to generate: Ollama's answer for loading the model.
    loaded = requests.post(
        server.url + "/api/chat", json={"model": name, "messages": []}, timeout=30
    ).json()
    assert loaded["done"] and loaded["done_reason"] == "load" and loaded["model"] == name
    with pytest.raises(ollama.ResponseError) as e:
        client.show("llama3.2:latest")
    assert e.value.status_code == 404 and e.value.error == "model 'llama3.2:latest' not found"


def test_raw_generate_equals_native_generate(server, client, name):
    prompt = "The capital of France is"
    got = client.generate(model=name, prompt=prompt, raw=True, options=GREEDY)
    ref = requests.post(
        server.url + "/generate",
        json={"text": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 16}},
        timeout=120,
    ).json()
    assert got.response == ref["text"] and got.done and got.model == name
    meta = ref["meta_info"]
    assert (got.prompt_eval_count, got.eval_count) == (
        meta["prompt_tokens"],
        meta["completion_tokens"],
    )
    assert got.done_reason == ("length" if meta["finish_reason"]["type"] == "length" else "stop")
    assert got.context is None  # raw mode returns no context, as in Ollama
    assert got.total_duration == got.prompt_eval_duration + got.eval_duration
    assert got.prompt_eval_duration > 0 and got.eval_duration > 0 and got.load_duration == 0
    streamed = list(
        client.generate(model=name, prompt=prompt, raw=True, options=GREEDY, stream=True)
    )
    assert "".join(p.response for p in streamed) == ref["text"]
    assert [p.done for p in streamed] == [False] * (len(streamed) - 1) + [True]


def test_templated_generate_equals_chat_route_and_context_continues(server, client, name):
    ref, prompt_ids = chat_route(
        server, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    )
    got = client.generate(model=name, prompt=USER, system=SYSTEM, options=GREEDY)
    assert got.response == ref["message"]["content"]
    assert got.context == prompt_ids + ref["token_ids"]  # the prompt's and the answer's ids
    # The context sent back goes before the next prompt, as the model sees it.
    follow = "And of Germany?"
    _, turn_ids = chat_route(server, [{"role": "user", "content": follow}], max_tokens=1)
    ids = list(got.context) + turn_ids
    native = requests.post(
        server.url + "/generate",
        json={"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 16}},
        timeout=120,
    ).json()
    more = client.generate(model=name, prompt=follow, context=got.context, options=GREEDY)
    assert more.response == native["text"] and more.prompt_eval_count == len(ids)
    assert more.context[: len(ids)] == ids
    streamed = list(
        client.generate(model=name, prompt=follow, context=got.context, options=GREEDY, stream=True)
    )
    assert "".join(p.response for p in streamed) == native["text"]
    assert streamed[-1].context == more.context


def test_chat_plain_and_streamed_equal_chat_route(server, client, name):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    ref, prompt_ids = chat_route(server, messages)
    got = client.chat(model=name, messages=messages, options=GREEDY)
    assert got.message.role == "assistant" and got.message.content == ref["message"]["content"]
    assert (got.prompt_eval_count, got.eval_count) == (len(prompt_ids), len(ref["token_ids"]))
    parts = list(client.chat(model=name, messages=messages, options=GREEDY, stream=True))
    assert len(parts) > 2 and [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == got.message.content
    last = parts[-1]
    assert last.done_reason == got.done_reason and last.eval_count == got.eval_count
    # logprobs: the chat route's entries, in Ollama's shape.
    ref_lp, _ = chat_route(server, messages, max_tokens=4, logprobs=True, top_logprobs=2)
    lp = client.chat(
        model=name,
        messages=messages,
        options={"temperature": 0, "num_predict": 4},
        logprobs=True,
        top_logprobs=2,
    ).logprobs
    assert [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in lp] == [
        (e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]])
        for e in ref_lp["logprobs"]["content"]
    ]


def test_format_schema_and_json(client, name):
    ask = "Reply with a JSON object with keys name and age for a person named Tom aged 30."
    got = client.chat(
        model=name,
        messages=[{"role": "user", "content": ask}],
        format=PERSON,
        options={"temperature": 0, "num_predict": 60},
    )
    jsonschema.validate(json.loads(got.message.content), PERSON)
    for raw in (False, True):
        j = client.generate(
            model=name,
            prompt=ask,
            raw=raw,
            format="json",
            options={"temperature": 0, "num_predict": 60},
        )
        assert j.done_reason == "stop" and isinstance(json.loads(j.response), dict)


def test_tools_give_tool_calls_as_the_chat_route(server, client, name):
    """A history with one call answered (Ollama's shapes: arguments an object, the result by
    tool_name) and a new question: the model calls the tool again, as on the chat route."""
    history = [
        {"role": "user", "content": "What is the weather in Berlin?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Berlin"}}}],
        },
        {"role": "tool", "content": "12 C, cloudy", "tool_name": "get_weather"},
        {"role": "assistant", "content": "It is 12 C and cloudy in Berlin."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    openai_form = [dict(m) for m in history]
    openai_form[1] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'},
            }
        ],
    }
    openai_form[2] = {"role": "tool", "content": "12 C, cloudy", "tool_call_id": "call_1"}
    ref, _ = chat_route(server, openai_form, max_tokens=60, tools=[WEATHER])
    want = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in ref["message"]["tool_calls"]
    ]
    assert want and all(n == "get_weather" for n, _ in want)
    opts = {"temperature": 0, "num_predict": 60}
    got = client.chat(model=name, messages=history, tools=[WEATHER], options=opts)
    calls = [(c.function.name, dict(c.function.arguments)) for c in got.message.tool_calls]
    assert calls == want and got.done_reason == "stop"
    streamed = list(
        client.chat(model=name, messages=history, tools=[WEATHER], options=opts, stream=True)
    )
    pieces = [c for p in streamed for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in pieces] == want


def _error(call) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as e:
        call()
    return e.value


def test_errors_in_ollamas_shape(server, client, name):
    def gen(**kw):
        return lambda: client.generate(**{"model": name, "prompt": "Hi", **kw})

    cases = [
        (gen(options={"temperature": "hot"}), 400, "options.temperature"),
        (gen(options={"nonsense": 1}), 400, "options.nonsense"),
        (gen(options={"num_ctx": 10**6}), 400, "options.num_ctx"),
        (gen(options={"num_predict": 10**6}), 400, "options.num_predict"),
        (gen(options={"repeat_penalty": -1.0}), 400, "options.repeat_penalty"),
        (gen(model="nope"), 404, "model 'nope' not found"),
        (gen(raw=True, context=[1, 2]), 400, "raw mode does not support"),
        (gen(suffix="return x"), 400, "suffix"),
        (gen(images=[b"\x89PNG\r\n"]), 400, "images"),
        (gen(think=True), 400, "does not support thinking"),
        (lambda: client.embed(model=name, input="Hi"), 400, "--is-embedding"),
    ]
    for call, status, words in cases:
        err = _error(call)
        assert err.status_code == status and words in err.error, (words, err)
    for body, words in [
        (b"{not json", "malformed JSON body"),
        (b'{"model": "m", "messages": 3}', "messages"),
        (b'{"model": "m", "prompt": "x", "stream": false, "temprature": 1}', "temprature"),
    ]:
        path = "/api/chat" if b"messages" in body else "/api/generate"
        r = requests.post(
            server.url + path,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert r.status_code == 400 and list(r.json()) == ["error"], r.text
        assert words in r.json()["error"]
    r = requests.get(server.url + "/api/pull", timeout=30)
    assert r.status_code in (404, 405) and list(r.json()) == ["error"]
    # Still serving.
    assert client.generate(model=name, prompt="Hi", options={"num_predict": 2}).eval_count == 2


# ------------------------------------------------------------------ thinking
def test_think_puts_reasoning_in_message_thinking(reasoning_server):
    url = reasoning_server.url
    client = ollama.Client(host=url, timeout=120)
    model = client.list().models[0].model
    ask = [{"role": "user", "content": "Is the sky blue?"}]
    opts = {"temperature": 0, "num_predict": 20}

    def route(**extra):
        choice, _ = chat_route(reasoning_server, ask, max_tokens=20, **extra)
        return choice["message"].get("reasoning_content"), choice["message"]["content"]

    thinking, content = route()
    assert thinking  # the tiny model's block is open from the start: it thinks
    got = client.chat(model=model, messages=ask, options=opts, think=True)
    assert (got.message.thinking, got.message.content or None) == (thinking, content or None)
    streamed = list(client.chat(model=model, messages=ask, options=opts, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in streamed) == thinking
    off = client.chat(model=model, messages=ask, options=opts, think=False)
    want_off = route(chat_template_kwargs={"enable_thinking": False})
    assert (off.message.thinking, off.message.content) == want_off
    gen = client.generate(model=model, prompt=ask[0]["content"], options=opts, think=True)
    assert (gen.thinking, gen.response or None) == (thinking, content or None)


# ------------------------------------------------------------------ embeddings
@pytest.fixture(scope="module")
def embedding_server(tiny_model_dir):
    # Quantized at load: the native kernels' outputs do not depend on the batch, so two routes'
    # embeddings are bitwise equal however the scheduler batches their texts (float32 MKL GEMMs
    # differ in the last bits between a batch of 1 and of 2, which load can decide).
    s = ServerProcess(
        "--model-path", tiny_model_dir, "--is-embedding", "--quantization", "q8_0", *TINY_SERVE
    )
    yield s
    s.stop()


def test_embed_equals_openai_embeddings(embedding_server):
    url = embedding_server.url
    client = ollama.Client(host=url, timeout=120)
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    model = client.list().models[0].model
    assert client.show(model).capabilities == ["embedding"]
    texts = ["The capital of France is Paris.", "hi"]

    def fresh(call):
        # Last-token pooling reuses a cached prefix, whose float sums differ in the last bits:
        # each side computes from an empty cache, in the same batch.
        assert requests.post(url + "/flush_cache", timeout=30).status_code == 200
        return call()

    ref = fresh(lambda: oai.embeddings.create(model="m", input=texts))
    got = fresh(lambda: client.embed(model=model, input=texts))
    assert got.model == model and got.prompt_eval_count == ref.usage.prompt_tokens
    assert [list(e) for e in got.embeddings] == [d.embedding for d in ref.data]
    ref_one = fresh(lambda: oai.embeddings.create(model="m", input=texts[1]))
    one = fresh(lambda: client.embeddings(model=model, prompt=texts[1]))
    assert list(one.embedding) == ref_one.data[0].embedding
    r = requests.post(url + "/api/embed", json={"model": model, "input": [1, 2]}, timeout=30)
    assert r.status_code == 400 and r.json() == {
        "error": "input must be a string or a list of strings"
    }
