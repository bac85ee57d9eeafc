"""SGLang's model gateway (`sglang-router` from PyPI: its Rust binary, pinned in the test extra) in
front of two radixlm servers, unchanged (issue 65): what it forwards is accepted (SGLang's whole
request object: `model: null`, `log_metrics`, `no_logs`, `return_bytes`, `return_entropy`,
`background`, `return_hidden_states`; `stream_reasoning` and `max_completion_tokens` on chat), so
/generate and the openai client's chat, plain and streamed, answer a worker's own greedy tokens; its
cache-aware policy finds the workers' cached prefixes more often than round robin; with one worker
killed, once the gateway's health check has seen it, every request still answers 200; and in its PD
mode over a radixlm prefill and decode server (their bootstrap port), chat plain and streamed, a
long prompt and a JSON-schema request answer an ordinary server's greedy tokens."""

from __future__ import annotations

import json
import random
import sys
import time

import jsonschema
import openai
import pytest
import requests

from radixlm.server.process import ServerProcess, free_port

GREEDY = {"max_new_tokens": 12, "temperature": 0}


def worker(model_dir: str) -> ServerProcess:
    return ServerProcess("--model-path", model_dir, "--num-threads", "1", "--kv-memory-gb", "0.05")


def gateway(urls: list[str], policy: str, *workers: str) -> ServerProcess:
    """The gateway over urls (regular mode), or over `workers` (its PD mode's arguments)."""

    def cmd(port):
        return [
            sys.executable,
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *(["--worker-urls", *urls] if urls else workers),
            "--policy",
            policy,
            "--prometheus-port",
            str(free_port()),
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "1",
            "--log-level",
            "warn",
        ]

    return ServerProcess(command=cmd, name=f"sglang-router ({policy})", timeout=60)


@pytest.fixture(scope="module")
def workers(tiny_model_dir):
    ws = [worker(tiny_model_dir), worker(tiny_model_dir)]
    yield ws
    for w in ws:
        w.stop()


def generate(url: str, body: dict) -> dict:
    r = requests.post(url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_and_chat_answer_a_workers_greedy_tokens(workers):
    gw = gateway([w.url for w in workers], "cache_aware")
    try:
        body = {"text": "The capital of France is", "sampling_params": GREEDY}
        direct = generate(workers[0].url, body)
        assert generate(gw.url, body)["output_ids"] == direct["output_ids"]
        messages = [{"role": "user", "content": "Name three colors."}]
        kw = dict(model="default", messages=messages, max_tokens=12, temperature=0)
        ours = openai.OpenAI(base_url=workers[1].url + "/v1", api_key="x")
        theirs = openai.OpenAI(base_url=gw.url + "/v1", api_key="x")
        want = ours.chat.completions.create(**kw).choices[0].message.content
        assert want
        assert theirs.chat.completions.create(**kw).choices[0].message.content == want
        stream = theirs.chat.completions.create(**kw, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
    finally:
        gw.stop()


def _cached_share(gw: ServerProcess, workers) -> float:
    """Shuffled groups of three prompts sharing a long prefix (cold caches): the share of prompt
    tokens the workers served from their caches."""
    for w in workers:
        assert requests.post(w.url + "/flush_cache", timeout=30).status_code == 200
    rng = random.Random(5)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]
    prefixes = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(8)]
    prompts = [(p, f" question {i}: why?") for p in prefixes for i in range(3)]
    rng.shuffle(prompts)
    cached = total = 0
    for prefix, question in prompts:
        out = generate(
            gw.url, {"text": prefix + question, "sampling_params": {"max_new_tokens": 1}}
        )
        cached += out["meta_info"]["cached_tokens"]
        total += out["meta_info"]["prompt_tokens"]
    return cached / total


def test_cache_aware_finds_the_cached_prefixes(workers):
    shares = {}
    for policy in ("round_robin", "cache_aware"):
        gw = gateway([w.url for w in workers], policy)
        try:
            shares[policy] = _cached_share(gw, workers)
        finally:
            gw.stop()
    print(f"cached share of prompt tokens: {shares}")
    assert shares["cache_aware"] >= 1.2 * shares["round_robin"], shares


def test_the_fields_accepted_off_only_are_refused_on(workers):
    """What the gateway forwards at its defaults is accepted; asking for what radixlm does not do
    is a 400 naming the field, and the worker keeps serving."""
    url = workers[0].url
    r = requests.post(
        url + "/generate",
        json={"text": "Hi", "sampling_params": GREEDY, "return_entropy": True},
        timeout=30,
    )
    assert r.status_code == 400 and "return_entropy" in r.json()["error"]["message"], r.text
    chat = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    for field, value in (("stream_reasoning", False), ("return_hidden_states", True)):
        r = requests.post(url + "/v1/chat/completions", json={**chat, field: value}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = requests.post(
        url + "/v1/chat/completions",
        json={**chat, "stream_reasoning": True, "return_hidden_states": False},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


def test_a_killed_worker_is_routed_around(workers):
    gw = gateway([w.url for w in workers], "round_robin")
    try:
        body = {"text": "Once upon a time", "sampling_params": GREEDY}
        want = generate(workers[0].url, body)["output_ids"]
        workers[1].proc.kill()
        workers[1].proc.wait()
        deadline = time.time() + 30
        while time.time() < deadline:  # the gateway's health check (every second) marks it
            listed = requests.get(gw.url + "/workers", timeout=5).json()["workers"]
            if not next(w for w in listed if w["url"] == workers[1].url)["is_healthy"]:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the gateway never marked the killed worker unhealthy")
        for _ in range(6):  # round robin would send every other one to the dead worker
            assert generate(gw.url, body)["output_ids"] == want
    finally:
        gw.stop()


def test_pd_mode_over_a_prefill_and_a_decode_server(workers, tiny_model_dir):
    bootstrap = free_port()
    prefill = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--num-threads",
        "1",
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        str(bootstrap),
    )
    decode = ServerProcess(
        "--model-path", tiny_model_dir, "--num-threads", "1", "--disaggregation-mode", "decode"
    )
    pd = ["--pd-disaggregation", "--prefill", prefill.url, str(bootstrap), "--decode", decode.url]
    gw = gateway([], "round_robin", *pd)
    try:
        plain = workers[0].url
        long_prompt = " ".join(f"word{i}" for i in range(220))  # ~840 of the 1,024 positions
        body = {"text": long_prompt, "sampling_params": GREEDY}
        out = generate(gw.url, body)
        assert out["meta_info"]["prompt_tokens"] > 600
        assert out["output_ids"] == generate(plain, body)["output_ids"]
        schema = {
            "type": "object",
            # bounded: the tiny random model's answer closes well inside max_tokens
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "age": {"type": "integer", "minimum": 0, "maximum": 99},
            },
            "required": ["name", "age"],
        }
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
        theirs = openai.OpenAI(base_url=gw.url + "/v1", api_key="x")
        ours = openai.OpenAI(base_url=plain + "/v1", api_key="x")
        for messages, extra in (
            ([{"role": "user", "content": "Name three colors."}], {}),
            ([{"role": "user", "content": "A person as JSON."}], {"response_format": fmt}),
        ):
            kw = dict(model="default", messages=messages, max_tokens=40, temperature=0, **extra)
            want = ours.chat.completions.create(**kw).choices[0].message.content
            assert theirs.chat.completions.create(**kw).choices[0].message.content == want
            stream = theirs.chat.completions.create(**kw, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
            if extra:
                jsonschema.validate(json.loads(want), schema)
    finally:
        gw.stop()
        prefill.stop()
        decode.stop()
