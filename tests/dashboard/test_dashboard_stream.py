"""/dashboard/stream over HTTP (no browser): behind the key, token text only with
--dashboard-show-text (compared with the tokenizer's own decoding), bad parameters a 400 naming
them, and the scheduler doing no dashboard work while nobody watches."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from transformers import AutoTokenizer

from tests.dashboard.conftest import ADMIN_KEY, KEY

AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = (
    "Once upon a time, in a land far away, there lived an old king",
    "Once upon a time, in a land far away, there lived a young queen",
)


def events(url, n, headers=None, interval=0.3):
    """The first n events of /dashboard/stream (the connection closed after)."""
    out = []
    with requests.get(
        f"{url}/dashboard/stream?interval={interval}", headers=headers, stream=True, timeout=30
    ) as r:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                out.append(json.loads(line[6:]))
                if len(out) == n:
                    break
    return out


def snapshots(url, headers=None) -> int:
    return requests.get(url + "/get_server_info", headers=headers, timeout=30).json()[
        "internal_state"
    ]["dashboard_snapshots"]


def generate(url, text, headers=None, n=4):
    r = requests.post(
        url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def test_the_page_is_open_and_its_data_needs_the_key(keyed_server):
    u = keyed_server.url
    page = requests.get(u + "/dashboard", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert (
        "default-src 'self'" in page.headers["content-security-policy"]
    )  # no CDN, no inline script
    for src in ("uPlot.iife.min.js", "common.js", "server.js", "uPlot.LICENSE"):
        assert requests.get(f"{u}/dashboard/static/{src}", timeout=10).status_code == 200
    assert requests.get(u + "/dashboard/static/secret.txt", timeout=10).status_code in (401, 404)
    denied = requests.get(u + "/dashboard/stream", timeout=10)
    assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
    wrong = requests.get(
        u + "/dashboard/stream", headers={"Authorization": "Bearer nope"}, timeout=10
    )
    assert wrong.status_code == 401
    assert len(events(u, 1, AUTH)) == 1
    # Not in the OpenAPI document: clients generated from it (and the fuzzer) would hang on the
    # stream.
    spec = requests.get(u + "/openapi.json", headers=AUTH, timeout=10).json()
    assert "/generate" in spec["paths"] and not [
        p for p in spec["paths"] if p.startswith("/dashboard")
    ]


@pytest.mark.parametrize(
    "query,param",
    [
        ("interval=0", "interval"),
        ("interval=abc", "interval"),
        ("max_nodes=-1", "max_nodes"),
        ("max_nodes=1.5", "max_nodes"),
    ],
)
def test_bad_parameters_are_400s_naming_them(open_server, query, param):
    r = requests.get(f"{open_server.url}/dashboard/stream?{query}", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert requests.get(open_server.url + "/health", timeout=10).status_code == 200


def test_tree_text_only_with_dashboard_show_text(keyed_server, open_server, tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    shared = common_prefix(*ids)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for server, headers, shown in ((keyed_server, AUTH, True), (open_server, None, False)):
        assert (
            requests.post(
                server.url + "/flush_cache", headers=admin if shown else None, timeout=30
            ).status_code
            == 200
        )
        outs = [generate(server.url, p, headers) for p in PROMPTS]
        assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(i) for i in ids]
        ev = events(server.url, 1, headers)[0]
        node = next(n for n in ev["tree"] if n["depth_tokens"] == len(shared))
        assert (
            node["children"] == 2 and len([n for n in ev["tree"] if n["parent"] == node["id"]]) == 2
        )
        heads = [r["prompt_head"] for r in ev["recent"][:2]]
        if shown:
            path, n = [], node
            while n is not None:  # the shared prefix's text: its nodes' texts from the root
                path.insert(0, n["text"])
                n = next((m for m in ev["tree"] if m["id"] == n["parent"]), None)
            assert "".join(path) == tok.decode(shared)
            assert heads == [PROMPTS[1], PROMPTS[0]]
        else:
            assert all("text" not in n for n in ev["tree"]) and heads == [None, None]
            assert ev["recent"][0]["cached_tokens"] == outs[1]["meta_info"]["cached_tokens"] > 0


def test_a_chat_prompts_head_is_its_templated_text(keyed_server, tiny_model_dir):
    """The chat routes send ids: with --dashboard-show-text the head is their first tokens
    decoded."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "user", "content": "What is the tallest mountain on Earth, and how tall is it?"}
    ]
    r = requests.post(
        keyed_server.url + "/v1/chat/completions",
        headers=AUTH,
        timeout=60,
        json={"messages": messages, "max_tokens": 4, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    ids = tok(
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )["input_ids"]
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    head = events(keyed_server.url, 1, AUTH)[0]["recent"][0]["prompt_head"]
    assert head == tok.decode(ids[:48])[:120]


def test_no_dashboard_work_in_the_scheduler_without_a_client(open_server):
    u = open_server.url
    before = snapshots(u)
    load = threading.Thread(
        target=lambda: [generate(u, f"request {i} with some words", n=16) for i in range(6)]
    )
    load.start()
    load.join()
    assert snapshots(u) == before  # many steps ran, none did dashboard work
    got = events(u, 3, interval=0.2)
    assert [e["state"]["dashboard_snapshots"] for e in got] == [before + 1, before + 2, before + 3]
    time.sleep(1.0)  # the closed connection's generator notices and stops
    after_close = snapshots(u)
    generate(u, "more work after the page closed", n=16)
    time.sleep(1.0)
    assert snapshots(u) == after_close
