"""SGLang's RL routes over HTTP (docs/rl.md), on a server started on random checkpoint A:
/update_weights_from_disk to checkpoint B gives a fresh server on B's greedy outputs (native and
through the openai client), the radix cache flushed, and /get_weights_by_name B's tensors; a bad or
foreign checkpoint is a 400 and A serves on; requests in flight finish on the old weights, one sent
after the update waits and runs on the new ones; /pause_generation in its three modes and
/continue_generation; /release_memory_occupation gives the memory back to the OS, requests wait,
/resume_memory_occupation brings A back. All of them are admin actions."""

from __future__ import annotations

import json
import threading
import time

import openai
import psutil
import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.checkpoints import damaged_copy, safetensors_tensor, tiny_like
from tests.server_faults import stream_events, wait_until

ADMIN = "rl-admin-key-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
PROMPTS = ["The capital of France is", "def fib(n):", "One, two, three,"]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
LONG = {
    "text": "Once upon a time",
    "sampling_params": {"max_new_tokens": 600, "temperature": 0, "ignore_eos": True},
}


def _generate(url: str, text, sp=GREEDY) -> list:
    r = requests.post(url + "/generate", json={"text": text, "sampling_params": sp}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _outputs(url: str) -> list[list[int]]:
    return [o["output_ids"] for o in _generate(url, PROMPTS)]


def _completion(url: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    return (
        client.completions.create(
            model=client.models.list().data[0].id, prompt=PROMPTS[0], max_tokens=8, temperature=0
        )
        .choices[0]
        .text
    )


def _post(url: str, path: str, body=None, auth=AUTH) -> requests.Response:
    return requests.post(url + path, json=body, headers=auth, timeout=120)


def _weights_state(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=30).json()["internal_state"]["weights"]


def _serve(url: str, path: str) -> None:
    r = _post(url, "/update_weights_from_disk", {"model_path": path})
    assert r.status_code == 200 and r.json()["success"], r.text


@pytest.fixture(scope="module")
def ckpt(tiny_model_dir, tmp_path_factory):
    return {
        "a": tiny_model_dir,
        "b": tiny_like(tiny_model_dir, str(tmp_path_factory.mktemp("ckpt-b")), seed=1),
    }


def _answers(url: str) -> dict:
    return {
        "outputs": _outputs(url),
        "completion": _completion(url),
        "long": _generate(url, LONG["text"], LONG["sampling_params"])["output_ids"],
    }


@pytest.fixture(scope="module")
def ref_b(ckpt):
    """B's answers from a fresh server on it."""
    s = ServerProcess("--model-path", ckpt["b"], *TINY)
    try:
        return _answers(s.url)
    finally:
        s.stop()


@pytest.fixture(scope="module")
def server(ckpt, ref_b):
    """A server on A, with A's answers from before any update (a fresh server on A)."""
    s = ServerProcess("--model-path", ckpt["a"], "--admin-api-key", ADMIN, *TINY)
    s.ref = {"a": _answers(s.url), "b": ref_b}
    assert s.ref["a"]["outputs"] != ref_b["outputs"] and s.ref["a"]["long"] != ref_b["long"]
    yield s
    s.stop()


@pytest.fixture
def ref(server):
    return server.ref


def test_update_weights_from_disk_serves_b_with_the_cache_flushed(server, ckpt, ref):
    url = server.url
    _serve(url, ckpt["a"])
    assert _outputs(url) == ref["a"]["outputs"]
    assert (
        _generate(url, PROMPTS[0])["meta_info"]["cached_tokens"] > 0
    )  # A's prompt is in the cache
    r = _post(url, "/update_weights_from_disk", {"model_path": ckpt["b"], "weight_version": "v2"})
    assert r.status_code == 200
    assert r.json() == {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to v2.",
        "num_paused_requests": 0,
    }
    assert (
        _generate(url, PROMPTS[0])["meta_info"]["cached_tokens"] == 0
    )  # flushed: nothing of A's KV is reused
    assert _outputs(url) == ref["b"]["outputs"]
    assert _completion(url) == ref["b"]["completion"]
    for name, size in [
        ("model.layers.1.self_attn.v_proj.weight", 3),
        ("model.layers.0.mlp.up_proj.weight", 2),
        ("model.norm.weight", 10),
        ("model.embed_tokens.weight", 1),
    ]:
        want = safetensors_tensor(ckpt["b"], name)[:size].tolist()
        got = requests.get(
            url + "/get_weights_by_name",
            json={"name": name, "truncate_size": size},
            headers=AUTH,
            timeout=30,
        )  # SGLang's clients send a GET with a JSON body
        assert got.status_code == 200 and got.json() == want, name
    assert _weights_state(url) == {
        "model_path": ckpt["b"],
        "weight_version": "v2",
        "paused": None,
        "released": [],
        "update_pending": False,
        "deferred_requests": 0,
    }


def test_a_bad_checkpoint_is_a_400_and_a_serves_on(server, ckpt, ref, tmp_path):
    url = server.url
    _serve(url, ckpt["a"])
    wider = tiny_like(
        ckpt["a"], str(tmp_path / "wider"), seed=3, hidden_size=128, intermediate_size=256
    )
    damaged = damaged_copy(ckpt["b"], str(tmp_path / "damaged"))
    # (body, the field named, why, refused by the scheduler: SGLang's success / message fields too)
    cases = [
        ({"model_path": str(tmp_path / "missing")}, "model_path", "does not exist", True),
        ({"model_path": wider}, "model_path", "has hidden_size 128, the served model 64", True),
        ({"model_path": damaged}, "model_path", "the weights did not load", True),
        ({"model_path": ckpt["b"], "load_format": "gguf"}, "load_format", "does not match", True),
        ({"model_path": 7}, "model_path", "model_path must be a non-empty string", False),
        (
            {"model_path": ckpt["b"], "flush_cache": "yes"},
            "flush_cache",
            "flush_cache must be a boolean",
            False,
        ),
        ({}, "model_path", "model_path must be a non-empty string", False),
    ]
    for body, param, reason, by_engine in cases:
        r = _post(url, "/update_weights_from_disk", body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and reason in err["message"], (body, err)
        if by_engine:
            assert r.json()["success"] is False and r.json()["message"] == err["message"]
    for path, body, param in [
        ("/get_weights_by_name", {"name": "model.layers.7.mlp.up_proj.weight"}, "name"),
        (
            "/get_weights_by_name",
            {"name": "model.norm.weight", "truncate_size": "3"},
            "truncate_size",
        ),
        ("/pause_generation", {"mode": "stop"}, "mode"),
        ("/release_memory_occupation", {"tags": "weights"}, "tags"),
        ("/resume_memory_occupation", {"tags": ["gpu"]}, "tags"),
        ("/continue_generation", {"now": True}, "now"),
    ]:
        r = _post(url, path, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, body, r.text)
    assert _outputs(url) == ref["a"]["outputs"]
    assert requests.get(url + "/health", timeout=10).status_code == 200
    assert _weights_state(url)["model_path"] == ckpt["a"]


def test_requests_in_flight_finish_on_the_old_weights(server, ckpt, ref):
    url = server.url
    _serve(url, ckpt["a"])
    stream: dict = {}
    t = threading.Thread(target=stream_events, args=(url, LONG, stream))
    t.start()
    assert wait_until(lambda: stream.get("started"), 60)
    update: dict = {}

    u = threading.Thread(
        target=lambda: update.update(
            response=_post(url, "/update_weights_from_disk", {"model_path": ckpt["b"]})
        )
    )
    u.start()
    assert wait_until(
        lambda: _weights_state(url)["update_pending"], 30
    )  # the scheduler waits for the stream
    later = _generate(url, PROMPTS[0])  # sent after the update: held back, then run on B
    u.join(120)
    t.join(120)
    assert update["response"].json() == {
        "success": True,
        "message": "Succeeded to update model weights.",
        "num_paused_requests": 1,
    }
    last = json.loads(stream["events"][-2])  # the last chunk before [DONE]
    assert (
        last["output_ids"] == ref["a"]["long"]
    )  # every token on A's weights: the update waited for it
    assert later["output_ids"] == ref["b"]["outputs"][0]

    # abort_all_requests: the requests in flight end now instead (SGLang's finish_reason abort)
    _serve(url, ckpt["a"])
    stream = {}
    t = threading.Thread(target=stream_events, args=(url, LONG, stream))
    t.start()
    assert wait_until(lambda: stream.get("started"), 60)
    r = _post(
        url, "/update_weights_from_disk", {"model_path": ckpt["b"], "abort_all_requests": True}
    )
    t.join(60)
    assert r.json()["success"]
    last = json.loads(stream["events"][-2])
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and len(last["output_ids"]) < 600
    assert _outputs(url) == ref["b"]["outputs"]


def _progress(stream: dict) -> int:
    events = [e for e in stream.get("events", []) if e != "[DONE]"]
    return len(json.loads(events[-1])["output_ids"]) if events else 0


@pytest.mark.parametrize("mode", ["in_place", "retract", "abort"])
def test_pause_and_continue_generation(mode, server, ckpt, ref):
    url = server.url
    _serve(url, ckpt["a"])
    stream: dict = {}
    t = threading.Thread(target=stream_events, args=(url, LONG, stream))
    t.start()
    assert wait_until(lambda: _progress(stream) >= 5, 60)
    r = _post(url, "/pause_generation", {"mode": mode})
    assert r.status_code == 200 and r.json() == {
        "message": "Generation paused successfully.",
        "status": "ok",
    }
    assert _weights_state(url)["paused"] == mode
    waiting: dict = {}  # a request sent while paused waits for /continue_generation
    w = threading.Thread(target=lambda: waiting.update(out=_generate(url, PROMPTS[1])))
    w.start()
    time.sleep(0.5)
    seen = _progress(stream)
    scheduler = psutil.Process(
        requests.get(url + "/get_server_info", timeout=30).json()["scheduler_pid"]
    )
    cpu = sum(scheduler.cpu_times()[:2])
    time.sleep(1.0)
    assert (
        sum(scheduler.cpu_times()[:2]) - cpu < 0.05
    )  # paused with a request waiting: the loop sleeps, no spin
    if mode == "abort":
        t.join(30)
        last = json.loads(stream["events"][-2])
        assert (
            last["meta_info"]["finish_reason"]["type"] == "abort" and len(last["output_ids"]) < 600
        )
    else:
        assert _progress(stream) == seen < 600 and t.is_alive()  # no token while paused
    assert "out" not in waiting and w.is_alive()
    r = _post(url, "/continue_generation")  # no body, as SGLang's clients send it
    assert r.status_code == 200 and r.json()["message"] == "Generation continued successfully."
    w.join(60)
    t.join(120)
    assert waiting["out"]["output_ids"] == ref["a"]["outputs"][1]
    if mode != "abort":  # greedy output unchanged by the pause (retract: recomputed from the cache)
        assert json.loads(stream["events"][-2])["output_ids"] == ref["a"]["long"]


def test_release_and_resume_memory_occupation(server, ckpt, ref):
    url = server.url
    _serve(url, ckpt["a"])
    info = requests.get(url + "/get_server_info", timeout=30).json()
    scheduler = psutil.Process(info["scheduler_pid"])
    # Refused while a request runs (SGLang asserts an idle server): pause first.
    stream: dict = {}
    t = threading.Thread(target=stream_events, args=(url, LONG, stream))
    t.start()
    assert wait_until(lambda: _progress(stream) >= 2, 60)
    r = _post(url, "/release_memory_occupation", {})
    assert r.status_code == 400 and "pause_generation first" in r.json()["error"]["message"]
    t.join(120)

    rss = scheduler.memory_info().rss
    r = _post(url, "/release_memory_occupation", {"tags": ["weights", "kv_cache"]})
    assert r.status_code == 200 and r.json()["success"]
    weights = sum(
        safetensors_tensor(ckpt["a"], n).numel() * 4 for n in ["model.embed_tokens.weight"]
    )
    freed = rss - scheduler.memory_info().rss
    # The CPU KV pool's pages are committed as they are written (cache/memory_pool.py), so releasing
    # it frees what was written, not kv_cache_bytes; the weights are resident whole.
    assert freed >= 0.85 * weights, (freed, info["kv_cache_bytes"], weights)
    assert _weights_state(url)["released"] == ["kv_cache", "weights"]
    r = requests.get(
        url + "/get_weights_by_name", json={"name": "model.norm.weight"}, headers=AUTH, timeout=30
    )
    assert r.status_code == 400 and "released" in r.json()["error"]["message"]
    waiting: dict = {}
    w = threading.Thread(target=lambda: waiting.update(out=_outputs(url)))
    w.start()
    time.sleep(1.0)
    assert "out" not in waiting  # requests wait for the memory to come back
    r = _post(url, "/resume_memory_occupation")
    assert r.status_code == 200 and r.json()["success"]
    w.join(60)
    assert waiting["out"] == ref["a"]["outputs"]

    # A colocated RL step: give the memory back, update to the trained checkpoint, resume the KV
    # cache.
    assert _post(url, "/release_memory_occupation").status_code == 200
    _serve(url, ckpt["b"])  # loads B into the freed room: the weights are held again
    assert _weights_state(url)["released"] == ["kv_cache"]
    assert (
        _post(url, "/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]}).status_code
        == 200
    )
    assert _outputs(url) == ref["b"]["outputs"]


def test_rl_routes_are_admin_actions(server):
    user = {"Authorization": "Bearer not-the-admin-key"}
    for path, body in [
        ("/update_weights_from_disk", {"model_path": "/x"}),
        ("/get_weights_by_name", {"name": "x"}),
        ("/pause_generation", {}),
        ("/continue_generation", {}),
        ("/release_memory_occupation", {}),
        ("/resume_memory_occupation", {}),
    ]:
        for auth in ({}, user):
            r = _post(server.url, path, body, auth=auth)
            assert r.status_code == 403 and "admin API key" in r.json()["error"]["message"], (
                path,
                r.text,
            )
    assert (
        _weights_state(server.url)["paused"] is None
        and _weights_state(server.url)["released"] == []
    )
