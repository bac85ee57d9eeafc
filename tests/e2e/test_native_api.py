"""The SGLang-compatible native API over raw HTTP, on the default model."""

import json

import requests

from radixlm.model.loader import load_tokenizer


def post(server, path, body, **kw):
    return requests.post(server.url + path, json=body, timeout=120, **kw)


def sse_events(resp):
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            events.append(line[len("data: ") :])
    return events


GREEDY = {"max_new_tokens": 12, "temperature": 0}


def test_single_and_batch(server):
    one = post(
        server, "/generate", {"text": "The capital of France is", "sampling_params": GREEDY}
    ).json()
    assert set(one) == {"text", "output_ids", "meta_info"}
    meta = one["meta_info"]
    for k in (
        "id",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "e2e_latency",
    ):
        assert k in meta
    assert (
        meta["finish_reason"] == {"type": "length", "length": 12} and len(one["output_ids"]) == 12
    )
    batch = post(
        server,
        "/generate",
        {"text": ["The capital of France is", "1, 2, 3,"], "sampling_params": GREEDY},
    ).json()
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[0]["output_ids"] == one["output_ids"]
    by_ids = post(
        server,
        "/generate",
        {
            "input_ids": [batch[1]["meta_info"]["prompt_tokens"] and 16, 28, 17, 28],
            "sampling_params": GREEDY,
        },
    ).json()
    assert by_ids["meta_info"]["prompt_tokens"] == 4
    per_item = post(
        server,
        "/generate",
        {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 3}]},
    ).json()
    assert [o["meta_info"]["completion_tokens"] for o in per_item] == [1, 3]


def test_stream_is_cumulative_and_ends_with_done(server):
    body = {"text": "Once upon a time", "sampling_params": GREEDY, "stream": True}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 3
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"])
    final = post(
        server, "/generate", {"text": "Once upon a time", "sampling_params": GREEDY}
    ).json()
    assert chunks[-1]["text"] == final["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == final["meta_info"]["finish_reason"]
    assert final["meta_info"]["finish_reason"]["type"] in ("length", "stop")


def test_prompt_scoring_and_logprob_shapes(server, default_model_path):
    tok = load_tokenizer(default_model_path)
    text = "The sky is blue and the grass is green."
    ids = tok.encode(text)
    r = post(
        server,
        "/generate",
        {
            "text": text,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        },
    ).json()
    meta = r["meta_info"]
    assert r["output_ids"] == [] and meta["completion_tokens"] == 0
    lps = meta["input_token_logprobs"]
    assert len(lps) == len(ids) and [t for _, t, _ in lps] == ids
    assert lps[0][0] is None and all(isinstance(lp, float) and lp <= 0 for lp, _, _ in lps[1:])
    assert all(text_ == tok.decode([t]) for _, t, text_ in lps)
    tops = meta["input_top_logprobs"]
    assert len(tops) == len(ids) and tops[0] is None
    assert all(
        len(t) == 2 and t[0][0] >= t[1][0] and t[0][0] >= lp
        for t, (lp, _, _) in zip(tops[1:], lps[1:])
    )
    g = post(
        server,
        "/generate",
        {
            "text": text,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            "return_logprob": True,
            "top_logprobs_num": 1,
        },
    ).json()
    out = g["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in out] == g["output_ids"] and all(x is None for _, _, x in out)
    # Greedy picks the top token, so its logprob is the top-1 logprob.
    assert len(out) == len(g["meta_info"]["output_top_logprobs"]) == 3
    assert all(
        abs(lp - top[0][0]) < 1e-6
        for (lp, _, _), top in zip(out, g["meta_info"]["output_top_logprobs"])
    )


def test_shared_prefix_reports_cached_tokens(server):
    prefix = "You are a meticulous assistant. " * 30
    a = post(
        server,
        "/generate",
        {"text": prefix + "Question one?", "sampling_params": {"max_new_tokens": 1}},
    ).json()
    b = post(
        server,
        "/generate",
        {"text": prefix + "Another question entirely?", "sampling_params": {"max_new_tokens": 1}},
    ).json()
    assert a["meta_info"]["prompt_tokens"] > 150
    assert b["meta_info"]["cached_tokens"] >= a["meta_info"]["prompt_tokens"] - 8


def test_stop_strings_are_trimmed(server):
    base = post(
        server,
        "/generate",
        {"text": "1, 2, 3, 4,", "sampling_params": {"max_new_tokens": 12, "temperature": 0}},
    ).json()
    assert " 7" in base["text"]
    r = post(
        server,
        "/generate",
        {
            "text": "1, 2, 3, 4,",
            "sampling_params": {"max_new_tokens": 12, "temperature": 0, "stop": " 7"},
        },
    ).json()
    assert r["text"] == base["text"][: base["text"].index(" 7")]
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": " 7"}


def test_info_endpoints(server):
    info = requests.get(server.url + "/get_model_info").json()
    assert info["is_generation"] is True and info["architectures"] == ["LlamaForCausalLM"]
    assert requests.get(server.url + "/model_info").json() == info
    si = requests.get(server.url + "/server_info").json()
    assert si["max_total_num_tokens"] > 0 and si["version"] and "internal_state" in si
    assert requests.get(server.url + "/health").status_code == 200
    assert requests.get(server.url + "/health_generate").status_code == 200
    t = post(server, "/tokenize", {"text": "hello world"}).json()
    assert t["count"] == len(t["tokens"]) > 0
    assert post(server, "/detokenize", {"tokens": t["tokens"]}).json()["text"] == "hello world"


def test_bad_input_is_4xx_naming_the_problem(server):
    cases = [
        ("{not json", "JSON"),
        ({"text": 5, "sampling_params": {}}, "text"),
        ({"text": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"text": "hi", "sampling_params": {"temperature": "hot"}}, "temperature"),
        ({"text": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
        ({"text": "hi", "sampling_params": {"bogus": 1}}, "bogus"),
        ({"text": "hi", "bogus_field": 1}, "bogus_field"),
        ({"text": ""}, "empty"),
        ({"input_ids": [1] * 9000}, "context length"),
        ({"sampling_params": {}}, "text or input_ids"),
    ]
    for body, word in cases:
        if isinstance(body, str):
            r = requests.post(
                server.url + "/generate",
                data=body,
                headers={"Content-Type": "application/json"},
                timeout=60,
            )
        else:
            r = post(server, "/generate", body)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
        assert word in r.json()["error"]["message"], (body, r.text)
        ok = post(server, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}})
        assert ok.status_code == 200
    assert post(server, "/abort_request", {}).status_code == 400
    assert post(server, "/detokenize", {"tokens": [-1]}).status_code == 400


def test_disconnect_mid_stream_frees_kv(server):
    body = {
        "text": "Write a very long story about a dragon.",
        "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True},
        "stream": True,
    }
    r = requests.post(server.url + "/generate", json=body, stream=True, timeout=120)
    lines = r.iter_lines()
    got = 0
    for line in lines:
        if line.startswith(b"data: "):
            got += 1
            if got == 5:
                break
    mid = requests.get(server.url + "/server_info").json()["internal_state"]
    assert mid["num_running"] == 1 and mid["protected_tokens"] > 0
    r.close()  # the client goes away
    import time

    for _ in range(100):
        st = requests.get(server.url + "/server_info").json()["internal_state"]
        if st["num_running"] == 0:
            break
        time.sleep(0.1)
    assert st["num_running"] == 0 and st["num_waiting"] == 0
    assert st["protected_tokens"] == 0
    assert st["available_kv_tokens"] + st["evictable_tokens"] == st["max_total_num_tokens"]
    assert st["generated_tokens"] - mid["generated_tokens"] < 1000, (
        "the request kept running after the disconnect"
    )
