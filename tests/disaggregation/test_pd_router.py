"""Issue 39: one prefill and one decode server behind `radixlm router --pd-disaggregation` answer
exactly as one ordinary server does (greedy tokens and logprobs, streamed and not, native and
OpenAI, structured output), the KV arrives bit for bit (checksums), 16 concurrent requests of mixed
lengths complete and leave both pools at baseline, and a multi-turn conversation's next turn
transfers only its new tokens (the decode server's own radix cache)."""

import concurrent.futures
import json

import jsonschema
import openai
import pytest
import requests

from tests.disaggregation.cluster import (
    GREEDY,
    decode,
    pool_at_baseline,
    prefill,
    router,
    server,
    state,
    wait_for,
)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    plain, p, d = server(tiny_model_dir), prefill(tiny_model_dir), decode(tiny_model_dir)
    r = router([p], [d])
    yield r, plain, p, d
    for s in (r, plain, p, d):
        s.stop()


def post(s, body, path="/generate", **kw):
    return requests.post(s.url + path, json=body, timeout=120, **kw)


def stream_events(s, body, path="/generate"):
    with post(s, {**body, "stream": True}, path, stream=True) as resp:
        assert resp.status_code == 200, resp.text
        lines = [ln[6:] for ln in resp.iter_lines() if ln.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [json.loads(x) for x in lines[:-1]]


LP = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3}


def test_greedy_tokens_and_logprobs_equal_one_server(cluster):
    r, plain, p, d = cluster
    for text in (
        "The quick brown fox jumps over the lazy dog",
        "word " * 150,
    ):  # one chunk; several chunks
        body = {"text": text, "sampling_params": GREEDY, **LP}
        want, got = post(plain, body).json(), post(r, body)
        assert got.status_code == 200, got.text
        got = got.json()
        assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]
        for key in (
            "output_token_logprobs",
            "output_top_logprobs",
            "input_token_logprobs",
            "input_top_logprobs",
        ):
            assert got["meta_info"][key] == want["meta_info"][key], key
        assert got["meta_info"]["prompt_tokens"] == want["meta_info"]["prompt_tokens"]
        # Streamed: growing chunks of the same tokens, and the same final logprobs.
        events, ref = stream_events(r, body), stream_events(plain, body)
        ids = [e["output_ids"] for e in events]
        assert len(ids) > 3 and all(
            len(a) < len(b) and b[: len(a)] == a for a, b in zip(ids, ids[1:])
        )
        assert ids[-1] == ref[-1]["output_ids"] == want["output_ids"]
        assert events[-1]["text"] == want["text"]
        for key in ("output_token_logprobs", "input_token_logprobs", "input_top_logprobs"):
            assert (
                events[-1]["meta_info"][key] == ref[-1]["meta_info"][key] == want["meta_info"][key]
            ), key
    assert (
        state(d)["disaggregation"]["transfers_ok"] >= 4
        and state(p)["disaggregation"]["transfers_ok"] >= 4
    )


def test_openai_client_through_the_pd_router(cluster):
    r, plain, _, _ = cluster
    clients = [openai.OpenAI(base_url=s.url + "/v1", api_key="x") for s in (r, plain)]
    msgs = [{"role": "user", "content": "Tell me about foxes"}]
    got, want = (
        c.chat.completions.create(
            model="m", messages=msgs, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2
        )
        for c in clients
    )
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].logprobs.content == want.choices[0].logprobs.content
    stream = clients[0].chat.completions.create(
        model="m", messages=msgs, max_tokens=10, temperature=0, stream=True
    )
    assert (
        "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        == want.choices[0].message.content
    )
    got, want = (
        c.completions.create(
            model="m", prompt="Once upon a time", max_tokens=10, temperature=0, logprobs=2
        )
        for c in clients
    )
    assert got.choices[0].text == want.choices[0].text
    assert got.choices[0].logprobs.token_logprobs == want.choices[0].logprobs.token_logprobs


def test_json_schema_through_the_pd_router(cluster):
    r, plain, _, _ = cluster
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    clients = [openai.OpenAI(base_url=s.url + "/v1", api_key="x") for s in (r, plain)]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    got, want = (
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "A person"}],
            max_tokens=60,
            temperature=0,
            response_format=fmt,
        )
        for c in clients
    )
    jsonschema.validate(json.loads(got.choices[0].message.content), schema)
    assert got.choices[0].message.content == want.choices[0].message.content


def test_transferred_kv_checksums_equal_the_source(cluster):
    r, _, p, d = cluster
    assert post(r, {"text": "checksum " * 40, "sampling_params": GREEDY}).status_code == 200
    sent, received = (
        state(p)["disaggregation"]["checksums"],
        state(d)["disaggregation"]["checksums"],
    )
    rooms = set(sent) & set(received)
    assert rooms and len(rooms) == len(
        received
    )  # every room the decode side received was sent here
    assert all(sent[room] == received[room] for room in rooms)
    assert (
        state(d)["disaggregation"]["bytes_received"] == state(p)["disaggregation"]["bytes_sent"] > 0
    )


def test_16_concurrent_mixed_length_requests(cluster):
    r, plain, p, d = cluster
    bodies = [
        {
            "text": f"request {i}: " + "lorem ipsum " * (3 + 9 * i),
            "sampling_params": {"max_new_tokens": 4 + i % 5, "temperature": 0},
        }
        for i in range(16)
    ]
    want = [post(plain, b).json()["output_ids"] for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda b: post(r, b), bodies))
    assert [g.status_code for g in got] == [200] * 16, [g.text for g in got if g.status_code != 200]
    assert [g.json()["output_ids"] for g in got] == want
    wait_for(
        lambda: pool_at_baseline(state(p)) and pool_at_baseline(state(d)),
        10,
        "both pools at baseline",
    )


def test_next_turn_transfers_only_new_tokens(cluster, tiny_model_dir):
    r, plain, _, d = cluster
    from radixlm.model.loader import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    turn1 = tok.encode("User: tell me a long story about a fox and a dog. Assistant:")
    out1 = post(r, {"input_ids": turn1, "sampling_params": GREEDY}).json()["output_ids"]
    new = tok.encode(" User: and then what happened next? Assistant:")
    turn2 = turn1 + out1 + new
    before = state(d)["disaggregation"]["tokens_received"]
    got = post(r, {"input_ids": turn2, "sampling_params": GREEDY})
    assert (
        got.status_code == 200
        and got.json()["output_ids"]
        == post(plain, {"input_ids": turn2, "sampling_params": GREEDY}).json()["output_ids"]
    )
    # The decode server holds turn 1's prompt and outputs (all but the last output's KV, which
    # turn 1 never computed): only that token and the new ones cross.
    assert state(d)["disaggregation"]["tokens_received"] - before == len(new) + 1


def test_bad_bootstrap_fields_are_400s(cluster):
    r, plain, p, d = cluster
    body = {"text": "hi", "sampling_params": GREEDY}
    e = post(
        plain, {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 1}
    )
    assert e.status_code == 400 and "bootstrap_room" in e.json()["error"]["message"]
    e = post(d, {**body, "bootstrap_host": "127.0.0.1", "bootstrap_room": 1})
    assert e.status_code == 400 and "bootstrap_port" in e.json()["error"]["message"]
    e = post(
        d, {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": -1}
    )
    assert e.status_code == 400 and "bootstrap_room" in e.json()["error"]["message"]
    e = post(r, {"text": ["a", "b"], "sampling_params": GREEDY})
    assert e.status_code == 400 and e.json()["error"]["param"] == "text"
    e = post(r, {**body, "sampling_params": {**GREEDY, "n": 2}})
    assert e.status_code == 400 and e.json()["error"]["param"] == "n"
    # A PD server still serves a request without bootstrap fields by itself.
    assert post(d, body).json()["output_ids"] == post(plain, body).json()["output_ids"]
