"""The OpenAI-compatible API through the official `openai` client (and raw HTTP for the error
cases), against the native /generate of the same server."""

import json
import re
import time

import jsonschema
import openai
import pytest
import requests

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer():
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer()


def native(server, **body) -> dict:
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def chat_prompt(tokenizer, messages) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def assert_logprobs_equal(got: list, want: list) -> None:
    # Same greedy request on the same server; only batching/caching float noise may differ.
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-3)


# ------------------------------------------------------------------------ models
def test_models(server, client, model):
    info = requests.get(server.url + "/get_model_info").json()
    assert model == info["served_model_name"]
    card = client.models.retrieve(model)
    assert card.id == model and card.owned_by == "radixlm"
    assert card.model_extra["max_model_len"] == info["context_length"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


# ------------------------------------------------------------------- completions
def test_completion_greedy_equals_native(server, client, model):
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    ref = native(server, text=PROMPT, sampling_params={"max_new_tokens": 12, "temperature": 0})
    c = out.choices[0]
    assert out.id.startswith("cmpl-") and out.object == "text_completion" and out.model == model
    assert c.text == ref["text"] and c.index == 0 and c.finish_reason == "length"
    assert out.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12
    # The same prompt as token ids gives the same text.
    ids = requests.post(server.url + "/tokenize", json={"text": PROMPT}).json()["tokens"]
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == ref["text"]


def test_completion_stream_with_usage(client, model):
    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0)
    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_batch_n_prompt_major(client, model):
    prompts = [PROMPT, "1, 2, 3, 4,"]
    single = [
        client.completions.create(model=model, prompt=p, max_tokens=6, temperature=0)
        .choices[0]
        .text
        for p in prompts
    ]
    out = client.completions.create(model=model, prompt=prompts, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert [c.text for c in out.choices] == [single[0], single[0], single[1], single[1]]
    assert out.usage.completion_tokens == 4 * 6
    sampled = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, n=2, seed=1, best_of=2
    )
    assert len(sampled.choices) == 2


def test_completion_logprobs(server, client, model):
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2
    )
    ref = native(
        server,
        text=PROMPT,
        sampling_params={"max_new_tokens": 6, "temperature": 0},
        return_logprob=True,
        top_logprobs_num=2,
    )
    lp = out.choices[0].logprobs
    assert (
        len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    )
    assert "".join(lp.tokens) == out.choices[0].text
    assert all(len(d) == 2 for d in lp.top_logprobs)  # greedy: the chosen token is among the top 2
    assert_logprobs_equal(
        lp.token_logprobs, [e[0] for e in ref["meta_info"]["output_token_logprobs"]]
    )
    for tok, d, want in zip(lp.tokens, lp.top_logprobs, lp.token_logprobs):
        assert d[tok] == want and max(d.values()) == want
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(6)]
    # echo: the prompt's tokens come first, the very first one without a logprob.
    echo = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True
    )
    e = echo.choices[0]
    assert e.text.startswith(PROMPT) and e.logprobs.token_logprobs[0] is None
    assert len(e.logprobs.tokens) == ref["meta_info"]["prompt_tokens"] + 2


def test_completion_stop(client, model):
    base = (
        client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
        .choices[0]
        .text
    )
    assert "." in base and "\n\n" in base
    c = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop="."
    ).choices[0]
    assert (
        c.text == base[: base.index(".")]
        and c.finish_reason == "stop"
        and c.model_extra["matched_stop"] == "."
    )
    # A stop string of several tokens: streamed text is trimmed as well (held back until decided).
    stop = base[base.index("\n\n") : base.index("\n\n") + 4]
    want = base[: base.index(stop)]
    chunks = list(
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop], stream=True
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproducible(client, model):
    kw = dict(
        model=model,
        prompt="Once upon a time",
        max_tokens=12,
        temperature=1.0,
        top_p=0.95,
        seed=1234,
    )
    a = client.completions.create(**kw).choices[0].text
    assert client.completions.create(**kw).choices[0].text == a


def test_cached_tokens(server, client, model):
    prefix = "You are a careful assistant. " + " ".join(
        f"Rule {i}: be concise and exact." for i in range(20)
    )
    n_prefix = len(requests.post(server.url + "/tokenize", json={"text": prefix}).json()["tokens"])
    client.completions.create(
        model=model, prompt=prefix + " Question one?", max_tokens=1, temperature=0
    )
    out = client.completions.create(
        model=model, prompt=prefix + " Question two?", max_tokens=1, temperature=0
    )
    assert out.usage.prompt_tokens_details.cached_tokens >= n_prefix
    assert out.usage.prompt_tokens_details.cached_tokens < out.usage.prompt_tokens


# -------------------------------------------------------------- chat completions
def test_chat_greedy_equals_native(server, client, model, tokenizer):
    out = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16, temperature=0)
    ref = native(
        server,
        text=chat_prompt(tokenizer, CHAT),
        sampling_params={"max_new_tokens": 16, "temperature": 0},
    )
    c = out.choices[0]
    assert out.id.startswith("chatcmpl-") and out.object == "chat.completion"
    assert c.message.role == "assistant" and c.message.content == ref["text"]
    assert c.finish_reason == (
        "length" if ref["meta_info"]["finish_reason"]["type"] == "length" else "stop"
    )
    assert out.usage.prompt_tokens == ref["meta_info"]["prompt_tokens"]
    assert out.usage.completion_tokens == ref["meta_info"]["completion_tokens"]
    # Content as a list of text parts renders the same prompt.
    parts = [{"role": "user", "content": [{"type": "text", "text": CHAT[0]["content"]}]}]
    again = client.chat.completions.create(
        model=model, messages=parts, max_tokens=16, temperature=0
    )
    assert again.choices[0].message.content == ref["text"]


def test_chat_stream(client, model):
    kw = dict(model=model, messages=CHAT, max_tokens=10, temperature=0)
    full = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert (
        chunks[0].object == "chat.completion.chunk"
        and chunks[0].choices[0].delta.role == "assistant"
    )
    with_choice = [c for c in chunks if c.choices]
    assert (
        "".join(c.choices[0].delta.content or "" for c in with_choice)
        == full.choices[0].message.content
    )
    assert with_choice[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in with_choice[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_chat_n_and_seed(client, model):
    kw = dict(model=model, messages=CHAT, max_tokens=8, temperature=1.0, n=2, seed=7)
    a = client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in client.chat.completions.create(**kw).choices] == [
        c.message.content for c in a.choices
    ]
    assert 2 <= a.usage.completion_tokens <= 16


def test_chat_logprobs(server, client, model, tokenizer):
    out = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    ref = native(
        server,
        text=chat_prompt(tokenizer, CHAT),
        sampling_params={"max_new_tokens": 6, "temperature": 0},
        return_logprob=True,
        top_logprobs_num=2,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(e.token for e in content) == out.choices[0].message.content
    assert_logprobs_equal(
        [e.logprob for e in content], [e[0] for e in ref["meta_info"]["output_token_logprobs"]]
    )
    assert len(ref["meta_info"]["output_top_logprobs"]) == len(content)
    for e, top in zip(content, ref["meta_info"]["output_top_logprobs"]):
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
        assert bytes(e.bytes) == e.token.encode()
        assert_logprobs_equal([t.logprob for t in e.top_logprobs], [t[0] for t in top])
    # Streamed, the same logprobs arrive spread over the chunks.
    chunks = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=6, temperature=0, logprobs=True, stream=True
    )
    streamed = [
        e for c in chunks for e in (c.choices[0].logprobs and c.choices[0].logprobs.content) or []
    ]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_chat_response_format_accepted(client, model):
    for rf in (
        {"type": "text"},
        {"type": "json_object"},
        {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True},
        },
    ):
        out = client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=2, response_format=rf
        )
        assert isinstance(out.choices[0].message.content, str) and out.choices[0].finish_reason in (
            "stop",
            "length",
        )
        assert 1 <= out.usage.completion_tokens <= 2


def test_logit_bias_and_stop_regex_equal_native(server, client, model):
    ids = requests.post(server.url + "/tokenize", json={"text": " Paris"}).json()["tokens"]
    bias = {str(ids[0]): -100}  # the greedy answer banned
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, logit_bias=bias
    )
    ref = native(
        server,
        text=PROMPT,
        sampling_params={"max_new_tokens": 8, "temperature": 0, "logit_bias": bias},
    )
    assert out.choices[0].text == ref["text"] and not ref["text"].startswith(" Paris")
    stopped = client.completions.create(
        model=model,
        prompt="Count: 1, 2, 3, 4,",
        max_tokens=30,
        temperature=0,
        extra_body={"stop_regex": r" [6-9],"},
    )
    full = native(
        server, text="Count: 1, 2, 3, 4,", sampling_params={"max_new_tokens": 30, "temperature": 0}
    )["text"]
    assert stopped.choices[0].text == full[: re.search(r" [6-9],", full).start()]
    assert stopped.choices[0].finish_reason == "stop"


def test_chat_structural_tag(client, model):
    """SGLang's structural_tag response_format: free text, and after a trigger, begin + JSON by
    the schema + end."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    rf = {
        "type": "structural_tag",
        "triggers": ["<weather="],
        "structures": [{"begin": "<weather=", "schema": schema, "end": "/>"}],
    }
    messages = [{"role": "user", "content": 'Write <weather={"city": "Paris"}/> and nothing else.'}]
    out = client.chat.completions.create(
        model=model, messages=messages, max_tokens=40, temperature=0, response_format=rf
    )
    for call in re.findall(r"<weather=(.*?)/>", out.choices[0].message.content):
        jsonschema.validate(json.loads(call), schema)
    # The same tag as SGLang's native structural_tag (extra_body), on a prompt that triggers it.
    listing = (
        '<weather={"city": "Paris"}/>\n<weather={"city": "Rome"}/>\n<weather={"city": "Oslo"}/>\n'
    )
    out = client.completions.create(
        model=model,
        prompt=listing,
        max_tokens=30,
        temperature=0,
        extra_body={"structural_tag": json.dumps(rf)},
    )
    calls = re.findall(r"<weather=(.*?)/>", out.choices[0].text)
    assert calls, out.choices[0].text
    for call in calls:
        jsonschema.validate(json.loads(call), schema)
    # The xgrammar form: the whole answer is the tag.
    rf2 = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<city>",
            "end": "</city>",
            "content": {"type": "json_schema", "json_schema": schema},
        },
    }
    out = client.chat.completions.create(
        model=model, messages=messages, max_tokens=40, temperature=0, response_format=rf2
    )
    text = out.choices[0].message.content
    assert text.startswith("<city>") and text.endswith("</city>"), text
    jsonschema.validate(json.loads(text[len("<city>") : -len("</city>")]), schema)


# ---------------------------------------------------------------------- errors
def post(server, path: str, body) -> requests.Response:
    data = body if isinstance(body, str) else json.dumps(body)
    return requests.post(
        server.url + path, data=data, headers={"Content-Type": "application/json"}, timeout=60
    )


OK_CHAT = {"messages": CHAT, "max_tokens": 2}
BAD = [
    ("/v1/completions", '{"prompt": "hi", ', 400, "malformed JSON"),
    ("/v1/chat/completions", "[1, 2]", 400, "JSON object"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "five"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": 12}, 400, "prompt"),
    ("/v1/chat/completions", {**OK_CHAT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": "hello"}, 400, "messages"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "model": "gpt-4o:sql"},
        404,
        "'sql'",
    ),  # any model, no such LoRA adapter
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4o:sql"}, 404, "'sql'"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "max_completion_tokens": -5},
        400,
        "max_completion_tokens",
    ),
    ("/v1/chat/completions", {"messages": [], "max_tokens": 2}, 400, "messages"),
    ("/v1/chat/completions", {"max_tokens": 2}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 400, "role"),
    ("/v1/completions", {"prompt": "hi", "top_q": 0.5}, 400, "top_q"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "stream_options": {"include_usage": True, "foo": 1}, "stream": True},
        400,
        "foo",
    ),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "response_format": {"type": "yaml"}},
        400,
        "response_format",
    ),
    ("/v1/chat/completions", {**OK_CHAT, "top_p": 1.5}, 400, "top_p"),
    ("/v1/chat/completions", {**OK_CHAT, "top_logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "suffix": "!"}, 400, "suffix"),
    ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 9, "max_tokens": 2}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": [1] * 9000}, 400, "context length"),
    ("/v1/completions", {"prompt": [1] * 9000, "stream": True}, 400, "context length"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "word " * 9000}]},
        400,
        "context length",
    ),
    ("/v1/completions", {"prompt": [10**7]}, 400, "vocabulary"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 300}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "stop_regex": "("}, 400, "stop_regex"),
    (
        "/v1/chat/completions",
        {**OK_CHAT, "response_format": {"type": "structural_tag"}},
        400,
        "structures",
    ),
    (
        "/v1/chat/completions",
        {
            **OK_CHAT,
            "response_format": {
                "type": "structural_tag",
                "triggers": ["<a"],
                "structures": [{"begin": "<a"}],
            },
        },
        400,
        "structural_tag",
    ),
]


@pytest.mark.parametrize(
    "path,body,status,needle", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)]
)
def test_bad_request(server, path, body, status, needle):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == status and "type" in err
    ok = post(server, path, OK_CHAT if "chat" in path else {"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_client_errors(client, model):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=model, prompt="hi", max_tokens=-3)
    with pytest.raises(openai.NotFoundError, match="nope"):
        client.chat.completions.create(model=f"{model}:nope", messages=CHAT, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="top_q"):
        client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=2, extra_body={"top_q": 1}
        )
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=model, messages=[], max_tokens=2)
    # SGLang's extra sampling fields are accepted.
    out = client.chat.completions.create(
        model=model,
        messages=CHAT,
        max_tokens=4,
        temperature=0.5,
        extra_body={
            "top_k": 5,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "min_tokens": 4,
            "ignore_eos": True,
        },
    )
    assert out.usage.completion_tokens == 4


# ------------------------------------------------------------------- disconnect
def running(server) -> int:
    return requests.get(server.url + "/server_info").json()["internal_state"]["num_running"]


def wait_idle(server, seconds: float = 10) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if running(server) == 0:
            return True
        time.sleep(0.2)
    return False


BUSY = {"prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "ignore_eos": True, "temperature": 0}


def test_stream_disconnect_aborts(server):
    with requests.post(
        server.url + "/v1/completions", json={**BUSY, "stream": True}, stream=True, timeout=60
    ) as r:
        assert next(line for line in r.iter_lines() if line).startswith(b"data: ")
    assert wait_idle(server), "the streamed request kept running after the client left"


def test_disconnect_aborts(server):
    try:
        with pytest.raises(requests.Timeout):
            requests.post(server.url + "/v1/completions", json=BUSY, timeout=1.5)
        assert wait_idle(server, 4), "the request kept running after the client left"
    finally:
        requests.post(server.url + "/abort_request", json={"rid": ""})
        wait_idle(server)
