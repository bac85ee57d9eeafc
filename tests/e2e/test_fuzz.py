"""Fuzzing the HTTP API (issue 16) on a tiny random model.

1. schemathesis over every operation of the server's own OpenAPI document (/openapi.json),
   schema-valid and schema-violating bodies: no 5xx, every 4xx in the one error shape.
2. Hand-written hostile bodies for /generate, /v1/completions and /v1/chat/completions:
   malformed JSON, wrong types, huge numbers, NaN, deep nesting, over-limit bodies, ...,
   each a 4xx whose message names the problem and carries no stack trace or file path.
3. Afterwards the server is alive, healthy and has leaked nothing (requests, KV, slots).
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from radixlm.server.process import ServerProcess

# A served name, not the model directory's path: error bodies name the served model (a 404 for
# another one), and they are checked for paths below.
SERVER_ARGS = (
    "--num-threads",
    "1",
    "--kv-memory-gb",
    "0.05",
    "--enable-invariant-checks",
    "--enable-metrics",
    "--served-model-name",
    "tiny",
)
# Generated cases per operation in schemathesis' fuzzing phase, schema-valid and schema-violating
# ones drawn together from this budget; its coverage phase adds deterministic boundary cases on
# top (several hundred for /generate and the OpenAI routes, a few for the others). Seeded and
# derandomized: the same cases on every run. 20 (it was 50, then 30): the generation in the test
# process is most of one of the suite's largest tests, and the coverage phase's boundary cases do
# not depend on it.
MAX_EXAMPLES = 20
SEED = 16
# What an error body must not show: a stack trace or a path on the server.
LEAKS = ("Traceback", 'File "', ".py", "/root", "site-packages")


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir, tmp_path_factory):
    # Admin here (loopback, no key): /start_profile's traces go to a temp directory (see cap_body).
    profiles = tmp_path_factory.mktemp("fuzz-profiles")
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        *SERVER_ARGS,
        env={"RADIXLM_TORCH_PROFILER_DIR": str(profiles)},
    )
    s.profile_dir = str(profiles)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def http(fuzz_server):
    with requests.Session() as session:
        session.trust_env = False  # a local server: no proxy lookup in the environment per request
        yield session


# ---------------------------------------------------------------------------------- checks
def check_error_body(status: int, text: str, sent: str = "") -> str:
    """A 4xx body is the server's one error shape with a message; returns the message. Leak
    markers that the request itself carried (the message may echo it) are not held against it."""
    body = json.loads(text)
    assert isinstance(body, dict) and body.get("object") == "error", text[:500]
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, text[:500]
    assert isinstance(err["message"], str) and err["message"].strip(), text[:500]
    assert isinstance(err["type"], str) and err["type"], text[:500]
    assert err["code"] == status, text[:500]
    for marker in LEAKS:
        assert marker not in text or marker in sent, f"{marker!r} in an error body: {text[:500]}"
    return err["message"]


ANTHROPIC_ERRORS = (
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
)


def check_anthropic_error(status: int, text: str, sent: str = "") -> None:
    """/v1/messages answers errors in Anthropic's shape: {"type": "error", "error": {type,
    message}}."""
    body = json.loads(text)
    assert isinstance(body, dict) and set(body) == {"type", "error"} and body["type"] == "error", (
        text[:500]
    )
    err = body["error"]
    assert set(err) == {"type", "message"} and err["message"].strip() and err["type"], text[:500]
    assert err["type"] in ANTHROPIC_ERRORS, text[:500]
    for marker in LEAKS:
        assert marker not in text or marker in sent, f"{marker!r} in an error body: {text[:500]}"


def check_anthropic_stream(text: str) -> None:
    """Anthropic's events end with message_stop, or with an error event that is not a server
    error."""
    events = [
        json.loads(line[len("data: ") :]) for line in text.split("\n") if line.startswith("data: ")
    ]
    assert events and events[0]["type"] == "message_start", text[:500]
    assert events[-1]["type"] in ("message_stop", "error"), text[-500:]
    if events[-1]["type"] == "error":
        assert events[-1]["error"]["type"] == "invalid_request_error", (
            f"server error inside a stream: {text[-500:]}"
        )


def check_ollama_error(status: int, text: str, sent: str = "") -> None:
    """Ollama's API (/api/*) answers errors in its shape: {"error": message}."""
    body = json.loads(text)
    assert isinstance(body, dict) and set(body) == {"error"}, text[:500]
    assert isinstance(body["error"], str) and body["error"].strip(), text[:500]
    for marker in LEAKS:
        assert marker not in text or marker in sent, f"{marker!r} in an error body: {text[:500]}"


def check_ollama_stream(text: str) -> None:
    """Ollama's NDJSON stream ends with its done object, or with an error object that is not a
    server error."""
    objs = [json.loads(line) for line in text.split("\n") if line.strip()]
    assert objs, f"an empty stream: {text[-500:]}"
    last = objs[-1]
    if "error" in last:
        assert "internal server error" not in last["error"], f"server error in a stream: {last}"
    else:
        assert last.get("done") is True and "done_reason" in last, text[-500:]
    assert all(o.get("done") is False for o in objs[:-1]), text[-500:]


def check_no_internal_failure(outs) -> None:
    """A native response (or streamed chunk) whose request the engine failed: a 200 status line,
    but finish_reason says abort with a 5xx status (an exception in the scheduler)."""
    for out in outs if isinstance(outs, list) else [outs]:
        reason = (
            (out.get("meta_info") or {}).get("finish_reason") if isinstance(out, dict) else None
        )
        if isinstance(reason, dict):
            assert reason.get("status_code", 200) < 500, f"the engine failed the request: {reason}"


def check_stream_errors(text: str) -> None:
    """An SSE stream ends with [DONE]; an error event in it (the status line was already 200)
    has the error shape and a 4xx code (a 5xx there is a server error all the same)."""
    # Split on "\n" only: str.splitlines also splits on U+2028 and friends, which JSON strings hold
    # raw.
    events = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", f"stream did not end with [DONE]: {text[-500:]}"
    for e in events[:-1]:
        obj = json.loads(e)
        if isinstance(obj, dict) and "error" in obj:
            err = obj["error"]
            assert isinstance(err.get("message"), str) and err["message"].strip(), e[:500]
            assert 400 <= err.get("code", 500) < 500, f"server error inside a stream: {e[:500]}"
        check_no_internal_failure(obj)


def check_responses_stream(text: str) -> None:
    """A Responses stream (no [DONE] line, as OpenAI's) ends with response.completed, .incomplete
    or .failed; a failure after the 200 status line is a 4xx one (its error event's code)."""
    events = [
        json.loads(line[len("data: ") :]) for line in text.split("\n") if line.startswith("data: ")
    ]
    assert events, f"an empty stream: {text[-500:]}"
    last = events[-1].get("type")
    assert last in ("response.completed", "response.incomplete", "response.failed"), text[-500:]
    for e in events:
        if e.get("type") == "error":
            assert str(e.get("message", "")).strip(), e
            assert 400 <= int(e.get("code", 500)) < 500, f"server error inside a stream: {e}"


def error_shape(ctx, response, case):
    """schemathesis check: every 4xx has the error shape; every stream is well formed."""
    sent = f"{case.body!r} {case.path_parameters!r} {case.query!r}"
    anthropic = case.operation.path.startswith("/v1/messages")
    ollama = case.operation.path.startswith("/api/")
    if 400 <= response.status_code < 500:
        check = check_ollama_error if ollama else check_error_body
        (check_anthropic_error if anthropic else check)(response.status_code, response.text, sent)
    ctype = response.headers.get("content-type", [""])[0]
    if ctype.startswith("application/x-ndjson"):
        check_ollama_stream(response.text)
    elif ctype.startswith("text/event-stream"):
        if anthropic:
            check_anthropic_stream(response.text)
        elif case.operation.path == "/v1/responses":
            check_responses_stream(response.text)
        else:
            check_stream_errors(response.text)
    elif response.status_code == 200 and ctype.startswith("application/json"):
        check_no_internal_failure(json.loads(response.text))


# ----------------------------------------------------------------------- 1. schemathesis
# The tiny model runs on one thread of a small machine: a generated request must not ask for
# hundreds of tokens (/generate's default is 128, chat's is the rest of the context, and the
# schema allows any max_new_tokens / max_tokens / n). Each generated body is capped before it is
# sent: token limits to MAX_NEW (set when absent), n to MAX_N. Only integers above the cap are
# lowered, so a wrongly typed or negative value still reaches the server as generated.
MAX_NEW, MAX_N = 4, 2


def _cap(d: dict, key: str, cap: int, set_missing: bool = False) -> None:
    v = d.get(key)
    if v is None and set_missing:
        d[key] = cap
    elif isinstance(v, int) and not isinstance(v, bool) and v > cap:
        d[key] = cap


def cap_body(case, profile_dir: str) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    if (
        case.operation.path == "/start_profile"
        and isinstance(body.get("output_dir"), str)
        and body["output_dir"]
    ):
        body["output_dir"] = (
            profile_dir  # a generated path would make directories anywhere on this machine
        )
    if case.operation.path == "/generate":
        if body.get("sampling_params") is None:
            body["sampling_params"] = {}
        sps = body["sampling_params"]
        for sp in sps if isinstance(sps, list) else [sps]:
            if isinstance(sp, dict):
                _cap(sp, "max_new_tokens", MAX_NEW, set_missing=True)
                _cap(sp, "n", MAX_N)
    elif case.operation.path == "/v1/messages":
        _cap(body, "max_tokens", MAX_NEW)  # required there: a body without it is a 400 to keep
    elif case.operation.path in ("/v1/completions", "/v1/chat/completions"):
        _cap(body, "max_tokens", MAX_NEW, set_missing=True)
        _cap(body, "max_completion_tokens", MAX_NEW)
        _cap(body, "n", MAX_N)
    elif case.operation.path == "/v1/responses":
        _cap(body, "max_output_tokens", MAX_NEW, set_missing=True)
    elif case.operation.path in ("/api/chat", "/api/generate"):
        # Ollama's default num_predict is -1: to the end of the context.
        if body.get("options") is None:
            body["options"] = {}
        if isinstance(body["options"], dict):
            opts = body["options"]
            if opts.get("num_predict") in (None, -1, -2):  # -2: fill the context
                opts["num_predict"] = MAX_NEW
            _cap(opts, "num_predict", MAX_NEW)


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    schema.config.generation.update(
        modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
        max_examples=MAX_EXAMPLES,
        deterministic=True,
    )
    schema.config.seed = SEED
    # schemathesis stops reading a stream after 20 events (then hangs up): read them all (generated
    # streams are short, see cap_body), so that each stream is checked up to its [DONE].
    schema.config.max_stream_events = 10_000
    return schema


# Filters go on the lazy schema: schemathesis replaces a fixture schema's own filters with these.
# Admin actions that stop generation until their counterpart is called (docs/rl.md): fuzzed, the
# server would hold every later request. test_weight_update_server.py covers their bad input.
# PUT /generate is POST /generate's handler under SGLang's second method
# (test_put_generate_is_post_generate sends it): its ~730 cases would repeat POST's.
fuzz_schema = (
    schemathesis.pytest.from_fixture("api_schema")
    .exclude(path=["/pause_generation", "/release_memory_occupation"])
    .exclude(method="PUT", path="/generate")
)


@fuzz_schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_schemathesis(case, fuzz_server, http):
    cap_body(case, fuzz_server.profile_dir)
    case.call_and_validate(
        base_url=fuzz_server.url, session=http, checks=[not_a_server_error, error_shape], timeout=60
    )


def test_openapi_document(fuzz_server, http):
    """What schemathesis (and any client generator) reads: every operation has its own
    operationId, and every $ref points at something in the document."""
    spec = http.get(fuzz_server.url + "/openapi.json", timeout=30).json()
    ids = [op["operationId"] for ops in spec["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)

    def refs(node):
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node["$ref"]
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    for ref in refs(spec):
        target = spec
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(target, dict) and part in target, f"dangling $ref {ref}"
            target = target[part]


def test_put_generate_is_post_generate(fuzz_server, http):
    """PUT /generate (SGLang's second method; left out of the schemathesis run) is POST's handler:
    the same greedy output, and the same error for the same bad body."""
    body = {"text": "Hello there", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    put, post = (
        http.request(m, fuzz_server.url + "/generate", json=body, timeout=60)
        for m in ("PUT", "POST")
    )
    assert put.status_code == post.status_code == 200, (put.text[:300], post.text[:300])
    assert put.json()["output_ids"] == post.json()["output_ids"]
    bad = {"text": "x", "sampling_params": {"max_new_tokens": "many"}}
    msgs = [
        expect_error(
            http.request(m, fuzz_server.url + "/generate", json=bad, timeout=60),
            (400, 422),
            "max_new_tokens",
        )
        for m in ("PUT", "POST")
    ]
    assert msgs[0] == msgs[1]


def test_router_errors_have_the_error_shape(fuzz_server, http):
    """The router's own answers (no such path, wrong method) in the one error shape too."""
    expect_error(http.get(fuzz_server.url + "/no/such/path", timeout=30), (404,), "not found")
    r = http.delete(fuzz_server.url + "/generate", timeout=30)
    expect_error(r, (405,), "not allowed")
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"POST", "PUT"}


# -------------------------------------------------------------------- 2. hostile bodies
# A valid request per route, and where its fields live ("a.b": field b of the object at a).
VALID = {
    "/generate": {"text": "Hello", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"prompt": "Hello", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2},
}
ROUTES = list(VALID)
SAMPLING = {"/generate": "sampling_params.", "/v1/completions": "", "/v1/chat/completions": ""}
MAX_TOKENS = {
    "/generate": "sampling_params.max_new_tokens",
    "/v1/completions": "max_tokens",
    "/v1/chat/completions": "max_tokens",
}


def with_field(route: str, path: str, value) -> dict:
    """The route's valid body with `path` ("a.0.b": field b of item 0 of field a) set to `value`."""
    body = json.loads(json.dumps(VALID[route]))
    if path == "input_ids":  # instead of the text, not besides it
        body.pop("text")
    *parents, leaf = path.split(".")
    node = body
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[leaf] = value
    return body


def with_raw(route: str, path: str, value, raw: str) -> bytes:
    """with_field, then the "@" in `value` replaced by raw JSON text (what json.dumps cannot
    write)."""
    return json.dumps(with_field(route, path, value)).replace('"@"', raw).encode()


def post_raw(
    http, server, route: str, data: bytes, content_type: str = "application/json", **headers
):
    return http.post(
        server.url + route, data=data, headers={"Content-Type": content_type, **headers}, timeout=60
    )


def expect_error(r, statuses: tuple, *words: str) -> str:
    """A 4xx in `statuses`, in the error shape, naming the problem (any of `words`)."""
    assert r.status_code in statuses, (r.status_code, r.text[:500])
    msg = check_error_body(r.status_code, r.text)
    assert any(w.lower() in msg.lower() for w in words), f"{msg!r} names none of {words}"
    return msg


def still_serves(http, server, route: str) -> None:
    r = http.post(server.url + route, json=VALID[route], timeout=60)
    assert r.status_code == 200, r.text[:500]


def dumps(route: str) -> bytes:
    return json.dumps(VALID[route]).encode()


@pytest.mark.parametrize("route", ROUTES)
def test_malformed_json(fuzz_server, http, route):
    ok = dumps(route)
    cases = {
        "truncated": ok[:-3],
        "trailing garbage": ok + b" }xyz",
        "single quotes": ok.replace(b'"', b"'"),
        "invalid UTF-8": ok.replace(b"Hello", b"Hel\xff\xfelo"),
        "UTF-8 BOM": b"\xef\xbb\xbf" + ok,
        "unpaired surrogate": ok.replace(b"Hello", b"Hel\\ud800lo"),
        "binary": bytes(range(256)),
    }
    for name, data in cases.items():
        msg = expect_error(post_raw(http, fuzz_server, route, data), (400,), "JSON")
        assert "malformed JSON body" in msg, (name, msg)
    for data in (b"", b" \r\n\t "):  # no body at all
        expect_error(post_raw(http, fuzz_server, route, data), (400,), "empty")
    still_serves(http, fuzz_server, route)


@pytest.mark.parametrize("route", ROUTES)
def test_top_level_not_an_object(fuzz_server, http, route):
    for value in ([], [VALID[route]], "hello", 42, 1.5, None, True):
        expect_error(
            post_raw(http, fuzz_server, route, json.dumps(value).encode()), (400,), "JSON object"
        )
    still_serves(http, fuzz_server, route)


# (field, a wrongly typed value, a word the message must have); 400 each.
WRONG_TYPES = {
    "/generate": [
        ("text", 5, "text"),
        ("text", {"a": 1}, "text"),
        ("text", [], "text"),
        ("text", ["a", 1], "text"),
        ("input_ids", "abc", "input_ids"),
        ("input_ids", [1.5], "input_ids"),
        ("input_ids", [True], "input_ids"),
        ("sampling_params", "x", "sampling_params"),
        ("sampling_params", [1, 2], "sampling_params"),
        ("sampling_params.max_new_tokens", "5", "max_new_tokens"),
        ("sampling_params.max_new_tokens", 2.5, "max_new_tokens"),
        ("sampling_params.temperature", "hot", "temperature"),
        ("sampling_params.top_p", [1], "top_p"),
        ("sampling_params.stop", 5, "stop"),
        ("sampling_params.n", True, "n"),
        ("sampling_params.seed", "s", "seed"),
        ("sampling_params.logit_bias", [1], "logit_bias"),
        ("sampling_params.regex", 5, "regex"),
        ("sampling_params.json_schema", 5, "json_schema"),
        ("sampling_params.no_such_key", 1, "no_such_key"),
        ("stream", "yes", "stream"),
        ("rid", 5, "rid"),
        ("rid", ["a"], "rid"),
        ("return_logprob", "yes", "return_logprob"),
        ("priority", "high", "priority"),
        ("priority", [1], "priority"),
        ("priority", 1.5, "priority"),
        ("top_logprobs_num", "3", "top_logprobs_num"),
        ("logprob_start_len", 1.5, "logprob_start_len"),
        ("no_such_field", 1, "no_such_field"),
        ("image_data", "x.png", "image_data"),
    ],
    "/v1/completions": [
        ("prompt", 5, "prompt"),
        ("prompt", {"a": 1}, "prompt"),
        ("prompt", [1.5], "prompt"),
        ("prompt", [], "prompt"),
        ("prompt", None, "prompt"),
        ("max_tokens", "5", "max_tokens"),
        ("max_tokens", 2.5, "max_tokens"),
        ("max_tokens", -1, "max_tokens"),
        ("temperature", "hot", "temperature"),
        ("n", "2", "n"),
        ("n", 0, "n"),
        ("stream", "yes", "stream"),
        ("stop", 5, "stop"),
        ("stop", [1], "stop"),
        ("logprobs", "x", "logprobs"),
        ("echo", "yes", "echo"),
        ("model", 5, "model"),
        ("seed", "x", "seed"),
        ("logit_bias", [1], "logit_bias"),
        ("logit_bias", {"x": 1}, "logit_bias"),
        ("stream_options", "x", "stream_options"),
        ("user", 5, "user"),
        ("top_k", 1.5, "top_k"),
        ("json_schema", 5, "json_schema"),
        ("no_such_field", 1, "no_such_field"),
    ],
    "/v1/chat/completions": [
        ("messages", "hi", "messages"),
        ("messages", [], "messages"),
        ("messages", [1], "messages"),
        ("messages.0.role", 5, "role"),
        ("messages.0.role", "robot", "role"),
        ("messages.0.content", 5, "content"),
        ("messages.0.content", [{"type": "image_url"}], "content"),
        ("messages.0.content", [{"text": "a"}], "content"),
        ("max_tokens", "5", "max_tokens"),
        ("max_completion_tokens", 2.5, "max_completion_tokens"),
        ("temperature", "hot", "temperature"),
        ("stream", "yes", "stream"),
        ("n", [2], "n"),
        ("response_format", "json", "response_format"),
        ("response_format", {"type": "xml"}, "response_format"),
        ("logprobs", "yes", "logprobs"),
        ("top_logprobs", "x", "top_logprobs"),
        ("tools", 5, "tools"),
        ("chat_template_kwargs", "x", "chat_template_kwargs"),
        ("stop", {"a": 1}, "stop"),
        ("seed", 1.5, "seed"),
        ("no_such_field", 1, "no_such_field"),
    ],
}


@pytest.mark.parametrize("route", ROUTES)
def test_wrong_types(fuzz_server, http, route):
    for field, value, word in WRONG_TYPES[route]:
        r = http.post(fuzz_server.url + route, json=with_field(route, field, value), timeout=60)
        expect_error(r, (400,), word)
    still_serves(http, fuzz_server, route)


@pytest.mark.parametrize("route", ROUTES)
def test_huge_numbers(fuzz_server, http, route):
    sp = SAMPLING[route]
    cases = [
        (MAX_TOKENS[route], 10**30, MAX_TOKENS[route].split(".")[-1]),
        (sp + "temperature", 1e308, "temperature"),
        (sp + "temperature", 10**400, "temperature"),  # an integer too large for a float
        (sp + "top_p", 1e300, "top_p"),
        (sp + "seed", 2**64, "seed"),
        (sp + "n", 10**30, "n"),
        (sp + "stop_token_ids", [10**30], "stop_token_ids"),
        (sp + "logit_bias", {"5": 1e300}, "logit_bias"),
        (sp + "logit_bias", {str(10**30): 1}, "logit_bias"),
        (sp + "top_k", 1.5, "top_k"),
    ]
    for field, value, word in cases:
        r = http.post(fuzz_server.url + route, json=with_field(route, field, value), timeout=60)
        expect_error(r, (400,), word)
    # 5000 digits: more than Python converts (its limit is 4300); json.dumps cannot even write it.
    data = with_raw(route, MAX_TOKENS[route], "@", "1" + "0" * 4999)
    expect_error(post_raw(http, fuzz_server, route, data), (400,), "digits")
    if (
        route == "/generate"
    ):  # any integer is a priority: a huge one must not break the scheduler's sort
        r = http.post(
            fuzz_server.url + route, json=with_field(route, "priority", -(10**400)), timeout=60
        )
        assert r.status_code == 200, r.text[:500]
    still_serves(http, fuzz_server, route)


@pytest.mark.parametrize("route", ROUTES)
def test_nan_and_infinity(fuzz_server, http, route):
    field = SAMPLING[route] + "temperature"
    for literal in ("NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1E400"):
        expect_error(
            post_raw(http, fuzz_server, route, with_raw(route, field, "@", literal)),
            (400,),
            literal,
        )
    still_serves(http, fuzz_server, route)


@pytest.mark.parametrize("route", ROUTES)
def test_deep_nesting(fuzz_server, http, route):
    def objects(depth: int) -> str:
        return '{"a": ' * depth + "1" + "}" * depth

    prompt = {"/generate": "text", "/v1/completions": "prompt", "/v1/chat/completions": "messages"}[
        route
    ]
    # 100000 nested lists where the prompt goes (200 kB: under the default body limit).
    data = with_raw(route, prompt, "@", "[" * 100_000 + "]" * 100_000)
    expect_error(post_raw(http, fuzz_server, route, data), (400,), "nested")
    # 10000 nested objects inside the sampling parameters, and in every free-form field; then
    # 500 levels, which Python's parser alone would take (what handles the values after it
    # recursed out of stack there), and 101: the limit is 100 levels for the whole body.
    free_form = {
        "/generate": [
            ("sampling_params.custom_params", "@"),
            ("sampling_params.json_schema", "@"),
            ("sampling_params.structural_tag", "@"),
            ("sampling_params.logit_bias", {"5": "@"}),
        ],
        "/v1/completions": [
            ("json_schema", "@"),
            ("structural_tag", "@"),
            ("logit_bias", {"5": "@"}),
        ],
        "/v1/chat/completions": [
            ("json_schema", "@"),
            ("metadata", "@"),
            ("chat_template_kwargs", "@"),
            ("logit_bias", {"5": "@"}),
            (
                "response_format",
                {"type": "json_schema", "json_schema": {"name": "x", "schema": "@"}},
            ),
            ("tools", ["@"]),
            ("messages.0.tool_calls", ["@"]),
        ],
    }[route]
    for depth in (10_000, 500, 101):
        for field, value in free_form:
            data = with_raw(route, field, value, objects(depth))
            expect_error(post_raw(http, fuzz_server, route, data), (400,), "nested")
    # Below the limit: a field that generation ignores takes deep nesting.
    ignored = {
        "/generate": "sampling_params.custom_params",
        "/v1/chat/completions": "metadata",
    }.get(route)
    if ignored:
        r = post_raw(http, fuzz_server, route, with_raw(route, ignored, "@", objects(90)))
        assert r.status_code == 200, r.text[:500]
    still_serves(http, fuzz_server, route)


@pytest.mark.parametrize("route", ROUTES)
def test_content_type(fuzz_server, http, route):
    # JSON only as a JSON type: the form and text types (and none) are what a web page may send to
    # another origin without a CORS preflight (CSRF), so curl needs -H 'Content-Type:
    # application/json'.
    for ctype in (
        "application/xml",
        "multipart/form-data; boundary=x",
        "text/html",
        "image/png",
        "application/x-www-form-urlencoded",
        "text/plain",
        "application/octet-stream",
    ):
        expect_error(
            post_raw(http, fuzz_server, route, dumps(route), ctype), (415,), "Content-Type"
        )
    r = http.post(fuzz_server.url + route, data=dumps(route), timeout=60)  # none
    assert r.status_code == 415 and "Content-Type" in r.json()["error"]["message"], r.text[:500]
    for ctype in ("application/vnd.api+json", "application/json; charset=utf-8"):
        r = http.post(
            fuzz_server.url + route, data=dumps(route), headers={"Content-Type": ctype}, timeout=60
        )
        assert r.status_code == 200, (ctype, r.text[:500])


@pytest.mark.parametrize("route", ROUTES)
def test_found_by_fuzzing(fuzz_server, http, route):
    """What the fuzzing above once found, pinned down."""
    bad_grammar = {"json_schema": '{"type": "nonsense"}'}
    several = {
        "/generate": with_field(route, "text", ["a", "b", "c"]),
        "/v1/completions": with_field(route, "prompt", ["a", "b", "c"]),
        "/v1/chat/completions": with_field(route, "n", 3),
    }[route]
    grammar_at = several["sampling_params"] if route == "/generate" else several
    grammar_at.update(bad_grammar)
    # A request of several sequences whose grammar does not compile: a 400 (a stream hung, and
    # without streaming the other sequences' waits were left pending).
    r = http.post(fuzz_server.url + route, json=several, timeout=30)
    expect_error(r, (400,), "json_schema")
    r = http.post(fuzz_server.url + route, json={**several, "stream": True}, timeout=30)
    if route == "/generate":  # native streams start at once: the error is an event
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text[:500]
        assert '"code": 400' in r.text and "json_schema" in r.text, r.text[:500]
    else:
        expect_error(r, (400,), "json_schema")
    if route == "/generate":
        # A batch repeating a rid: a 400, and the items registered before the repeat are released
        # (test_server_intact_after_fuzzing checks that nothing stays tracked).
        expect_error(
            http.post(
                fuzz_server.url + route,
                json={**with_field(route, "text", ["a", "b"]), "rid": "same"},
                timeout=30,
            ),
            (400,),
            "rid",
        )
        # A priority that is not an integer killed the scheduler.
        expect_error(
            http.post(fuzz_server.url + route, json=with_field(route, "priority", [5]), timeout=30),
            (400,),
            "priority",
        )
    # A constraint with non-ASCII text: the text it forces next may start inside a character
    # (after a token holding that character's first byte); jump-forward failed the request.
    for seed in range(1, 6):
        constraint = {"regex": "(«»|é){3}", "seed": seed}
        body = {**VALID[route], **constraint, "max_tokens": 6}
        if route == "/generate":
            body = {"text": "x", "sampling_params": {**constraint, "max_new_tokens": 6}}
        elif route == "/v1/completions":
            body["prompt"] = "x"
        r = http.post(fuzz_server.url + route, json=body, timeout=60)
        assert r.status_code == 200, r.text[:500]
        out = r.json()
        reason = (
            out["meta_info"]["finish_reason"]
            if route == "/generate"
            else out["choices"][0]["finish_reason"]
        )
        assert reason != "abort" and (not isinstance(reason, dict) or reason["type"] != "abort"), (
            out
        )
    # A regex needing text the vocabulary cannot spell (a control character, first or after a
    # token): the mask allows no token. It was a 500 ("the grammar rejected a token"); it is the
    # client's pattern, a 400 naming it.
    for regex in ("\x04", "a\x04"):
        body = {**VALID[route], "regex": regex, "max_tokens": 4}
        if route == "/generate":
            body = {"text": "x", "sampling_params": {"regex": regex, "max_new_tokens": 4}}
        expect_error(http.post(fuzz_server.url + route, json=body, timeout=60), (400,), "regex")
    still_serves(http, fuzz_server, route)


def _raw_request(server, head: bytes, body: bytes, half_close: bool = False) -> tuple[int, str]:
    """One request on a plain socket (for what an HTTP client will not send): status and body."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + b"\r\n" + body)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while b"\r\n\r\n" not in data or len(data) < _expected_len(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head_part, _, payload = data.partition(b"\r\n\r\n")
    return int(head_part.split()[1]), payload.decode(errors="replace")


def _expected_len(data: bytes) -> int:
    head, _, _ = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return 1 << 62


@pytest.fixture(scope="module")
def small_limit_server(tiny_model_dir):
    s = ServerProcess(
        "--model-path", tiny_model_dir, *SERVER_ARGS, "--max-request-body-bytes", "100000"
    )
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("route", ROUTES)
def test_body_over_the_limit(small_limit_server, route):
    s = small_limit_server
    big = json.dumps(
        with_field(route, "user" if route != "/generate" else "rid", "x" * 200_000)
    ).encode()
    with requests.Session() as http:
        # Declared by Content-Length: refused before reading.
        expect_error(post_raw(http, s, route, big), (413,), "larger than")

        # Chunked (no Content-Length): refused while reading, once past the limit.
        def chunks():
            for i in range(0, len(big), 8192):
                yield big[i : i + 8192]

        r = http.post(
            s.url + route, data=chunks(), headers={"Content-Type": "application/json"}, timeout=60
        )
        assert "chunked" in r.request.headers.get("Transfer-Encoding", "")
        expect_error(r, (413,), "larger than")
        still_serves(http, s, route)
    # A Content-Length that lies: smaller than the body (the server reads what it announced: a
    # truncated JSON body), and larger than the limit with a small body (refused at once).
    path = route.encode()
    head = (
        b"POST "
        + path
        + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
    )
    status, body = _raw_request(s, head + b"Content-Length: 10\r\n", dumps(route))
    assert status == 400 and "JSON" in check_error_body(status, body), body
    status, body = _raw_request(
        s, head + b"Content-Length: 10000000\r\n", dumps(route), half_close=True
    )
    assert status == 413 and "larger than" in check_error_body(status, body), body
    # A chunked body that grows past the limit in one declared chunk.
    status, body = _raw_request(
        s,
        head + b"Transfer-Encoding: chunked\r\n",
        f"{len(big):x}\r\n".encode() + big + b"\r\n0\r\n\r\n",
    )
    assert status == 413 and "larger than" in check_error_body(status, body), body
    with requests.Session() as http:
        still_serves(http, s, route)


# ------------------------------------------------------------- 3. nothing broke, nothing leaked
def test_server_intact_after_fuzzing(fuzz_server, http):
    """Runs last in this file: after the schemathesis run and the hostile bodies above, the
    server lives, is healthy, and holds no request, KV token or request slot (aborted and
    refused requests drain asynchronously: polled for a few seconds)."""
    assert fuzz_server.proc.poll() is None, fuzz_server.output()[-3000:]
    assert http.get(fuzz_server.url + "/health", timeout=10).status_code == 200
    deadline = time.time() + 10
    while True:
        info = http.get(fuzz_server.url + "/get_server_info", timeout=30).json()
        st = info["internal_state"]
        leaks = {
            "num_tracked_requests": info["num_tracked_requests"],
            "num_running": st["num_running"],
            "num_waiting": st["num_waiting"],
            "busy_req_slots": st["req_slots_total"] - st["req_slots_free"],
            "held_kv_tokens": (
                info["max_total_num_tokens"] - st["available_kv_tokens"] - st["evictable_tokens"]
            ),
        }
        if not any(leaks.values()):
            break
        assert time.time() < deadline, f"leaked after fuzzing: {leaks}"
        time.sleep(0.2)
    still_serves(http, fuzz_server, "/generate")
    # Nothing was logged as an exception either: a request the engine failed, or an error the
    # HTTP server turned into a 500, logs its traceback (the client sees neither).
    log = fuzz_server.output()
    assert "Traceback" not in log, log[log.index("Traceback") - 300 :][:5000]
