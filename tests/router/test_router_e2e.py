"""`radixlm router` in front of two tiny-model servers: every API through it, streaming chunk by
chunk, the official openai client, cache-aware stickiness, workers added, removed, killed and
back, API keys on both sides."""

import json
import sys
import threading

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from radixlm.server.process import ServerProcess, free_port

WORKER_KEY, ROUTER_KEY = "worker-secret", "router-secret"
WORKER_ADMIN_KEY, ROUTER_ADMIN_KEY = "worker-admin-secret", "router-admin-secret"
GREEDY = {"max_new_tokens": 16, "temperature": 0}


def worker(model_dir, port=None):
    return ServerProcess(
        "--model-path",
        model_dir,
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--api-key",
        WORKER_KEY,
        "--admin-api-key",
        WORKER_ADMIN_KEY,
        port=port,
    )


def router(urls, *extra):
    def cmd(port):
        return [
            sys.executable,
            "-m",
            "radixlm.cli",
            "router",
            "--port",
            str(port),
            "--worker-urls",
            *urls,
            "--worker-api-key",
            WORKER_KEY,
            "--api-key",
            ROUTER_KEY,
            "--admin-api-key",
            ROUTER_ADMIN_KEY,
            "--worker-admin-api-key",
            WORKER_ADMIN_KEY,
            "--health-check-interval-secs",
            "0.5",
            "--health-failure-threshold",
            "2",
            "--health-success-threshold",
            "1",
            "--log-level",
            "warning",
            *extra,
        ]

    return ServerProcess(command=cmd, name="the router")


def post(url, path, body, key=ROUTER_KEY, **kw):
    return requests.post(
        url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60, **kw
    )


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    ws = [worker(tiny_model_dir), worker(tiny_model_dir)]
    r = router([w.url for w in ws])
    yield r, ws
    r.stop()
    for w in ws:
        w.stop()


def test_native_generate_equals_a_worker_and_streams_chunk_by_chunk(cluster):
    r, ws = cluster
    body = {"text": "The quick brown fox", "sampling_params": GREEDY}
    direct = post(ws[0].url, "/generate", body, key=WORKER_KEY).json()
    via = post(r.url, "/generate", body)
    assert via.status_code == 200 and via.json()["text"] == direct["text"]
    with post(r.url, "/generate", {**body, "stream": True}, stream=True) as resp:
        events = [line for line in resp.iter_lines() if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]" and len(events) > 3  # many chunks, not one buffered answer
    assert json.loads(events[-2][6:])["text"] == direct["text"]
    # The key: the router's for clients, the workers' never accepted at the router.
    assert post(r.url, "/generate", body, key="wrong").status_code == 401
    assert post(r.url, "/generate", body, key=WORKER_KEY).status_code == 401
    assert requests.get(r.url + "/health", timeout=5).status_code == 200  # open route


def test_openai_client_through_the_router(cluster):
    r, _ = cluster
    client = openai.OpenAI(base_url=r.url + "/v1", api_key=ROUTER_KEY)
    model = client.models.list().data[0].id
    c = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert c.choices[0].text and c.usage.completion_tokens > 0
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0
    )
    assert isinstance(chat.choices[0].message.content, str) and chat.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    assert (
        "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        == chat.choices[0].message.content
    )
    with pytest.raises(openai.BadRequestError):  # a worker's 4xx comes back as it is
        client.completions.create(model=model, prompt="x", max_tokens=-1)


def test_cache_aware_keeps_a_prefix_on_one_worker_and_admin_routes(cluster):
    r, ws = cluster
    before = {
        w["url"]: w["routed"]
        for w in requests.get(r.url + "/list_workers", headers=_auth(), timeout=5).json()["workers"]
    }
    doc = "A long shared document about rivers and bridges. " * 20
    for i in range(6):
        assert (
            post(
                r.url, "/generate", {"text": doc + f"Question {i}?", "sampling_params": GREEDY}
            ).status_code
            == 200
        )
    after = {
        w["url"]: w["routed"]
        for w in requests.get(r.url + "/list_workers", headers=_auth(), timeout=5).json()["workers"]
    }
    assert sorted(after[u] - before[u] for u in after) == [0, 6]  # all six on one worker
    info = requests.get(r.url + "/get_server_info", headers=_auth(), timeout=10).json()
    assert set(info["workers"]) == {w.url for w in ws} and info["router"]["policy"] == "cache_aware"
    assert info["router"]["decisions"]["cache_hit"] >= 5
    # /metrics carries the workers' own cache hit rates, as each reports it.
    samples = {
        (s.name, s.labels.get("worker")): s.value
        for fam in text_string_to_metric_families(
            requests.get(r.url + "/metrics", headers=_auth(), timeout=5).text
        )
        for s in fam.samples
    }
    busy = max(after, key=lambda u: after[u] - before[u])
    st = requests.get(
        busy + "/get_server_info", headers={"Authorization": f"Bearer {WORKER_KEY}"}, timeout=10
    ).json()["internal_state"]
    assert st["cached_tokens"] > 0  # five of the six found the document cached
    assert samples[("radixlm_router:worker_cache_hit_rate", busy)] == pytest.approx(
        st["cached_tokens"] / st["prompt_tokens"]
    )
    assert samples[("radixlm_router:worker_cached_tokens", busy)] == st["cached_tokens"]
    assert 0 < samples[("radixlm_router:cache_hit_rate", None)] <= 1
    assert samples[("radixlm_router:cache_aware_hit_rate", None)] > 0
    assert ("radixlm_router:worker_load", busy) in samples
    assert post(r.url, "/flush_cache", {}).status_code == 403  # an admin route
    flushed = post(r.url, "/flush_cache", {}, key=ROUTER_ADMIN_KEY)
    assert flushed.status_code == 200 and all(
        v["status"] == 200 for v in flushed.json()["workers"].values()
    )


def _auth():
    return {"Authorization": f"Bearer {ROUTER_KEY}"}


def test_killed_worker_fails_no_request_and_its_return_is_noticed(tiny_model_dir, cluster):
    port = free_port()
    # The stable worker: one of the module's cluster (its own router goes on checking it too).
    stable, victim = cluster[1][0], worker(tiny_model_dir, port=port)
    r = router([stable.url, victim.url], "--policy", "round_robin")
    try:
        results, errors, cut_streams = [], [], []

        def client(i):
            body = {"text": f"request {i}", "sampling_params": {**GREEDY, "max_new_tokens": 24}}
            if i % 2:
                try:
                    resp = post(r.url, "/generate", body)
                    results.append(resp.status_code)
                except requests.RequestException as e:
                    errors.append(e)
                return
            started = False  # a stream may break only after its first chunk reached the client
            try:
                with post(r.url, "/generate", {**body, "stream": True}, stream=True) as resp:
                    status = resp.status_code
                    events = []
                    for line in resp.iter_lines():
                        if line.startswith(b"data: "):
                            started = True
                            events.append(line)
                if status == 200 and events and events[-1] == b"data: [DONE]":
                    results.append(200)
                elif started:
                    cut_streams.append(i)
                else:
                    results.append(status)
            except requests.RequestException as e:
                (cut_streams if started else errors).append(i if started else e)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for i, t in enumerate(threads):
            t.start()
            if i == 6:
                victim.proc.kill()  # no drain: connections refused or reset from here on
        for t in threads:
            t.join()
        # A request whose worker died before answering was retried on the other one; only a stream
        # already under way may have been cut.
        assert not errors and results.count(200) == len(results) == 16 - len(cut_streams), (
            results,
            errors,
        )
        status = {
            w["url"]: w
            for w in requests.get(r.url + "/list_workers", headers=_auth(), timeout=5).json()[
                "workers"
            ]
        }
        _wait(lambda: not _workers(r)[victim.url]["healthy"])
        assert requests.get(r.url + "/health", timeout=5).status_code == 200
        assert status[stable.url]["healthy"]
        back = worker(tiny_model_dir, port=port)
        try:
            _wait(lambda: _workers(r)[back.url]["healthy"])
        finally:
            back.stop()
        # Removed and added at run time.
        assert (
            post(r.url, "/remove_worker?url=" + victim.url, {}).status_code == 403
        )  # admin routes
        assert (
            post(r.url, "/remove_worker?url=" + victim.url, {}, key=ROUTER_ADMIN_KEY).status_code
            == 200
        )
        assert victim.url not in _workers(r)
        assert (
            post(r.url, "/remove_worker?url=" + victim.url, {}, key=ROUTER_ADMIN_KEY).status_code
            == 404
        )
        assert post(r.url, "/add_worker?url=not-a-url", {}, key=ROUTER_ADMIN_KEY).status_code == 400
    finally:
        r.stop()
        victim.stop()


def _workers(r):
    return {
        w["url"]: w
        for w in requests.get(r.url + "/list_workers", headers=_auth(), timeout=5).json()["workers"]
    }


def _wait(cond, timeout=20.0):
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def test_client_disconnect_aborts_the_worker_request(cluster):
    """A stream dropped by its client after the first chunk: the router closes the worker's
    connection, the worker aborts the request (nothing left running, every KV slot free) and the
    router's in-flight count returns to zero."""
    r, ws = cluster
    want = 900  # the tiny model's context is 1024: the request may run to here if nobody aborts it
    body = {
        "text": "Count forever:",
        "sampling_params": {"max_new_tokens": want, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    before = [_state(w) for w in ws]
    resp = post(r.url, "/generate", body, stream=True)
    first = next(line for line in resp.iter_lines() if line.startswith(b"data: "))
    assert json.loads(first[6:])["meta_info"]["completion_tokens"] >= 1
    resp.close()

    def idle():
        states = [_state(w) for w in ws]
        return (
            all(s["num_running"] == 0 for s in states)
            and all(
                s["available_kv_tokens"] + s["evictable_tokens"] == s["max_total_num_tokens"]
                for s in states
            )
            and all(w["load"] == 0 for w in _workers(r).values())
        )

    _wait(idle)
    after = [_state(w) for w in ws]

    def grew(key):
        return sum(a[key] - b[key] for a, b in zip(after, before))

    # A worker ran it (its prompt was prefilled), then stopped early: aborted, not run to its
    # length. generated_tokens counts decode steps only, so an abort that lands before the first
    # decode step (a loaded machine) leaves it at 0.
    assert grew("prompt_tokens") >= 1
    assert grew("generated_tokens") < want - 1, grew("generated_tokens")


def _state(w):
    return requests.get(
        w.url + "/get_server_info", headers={"Authorization": f"Bearer {WORKER_KEY}"}, timeout=5
    ).json()["internal_state"]
