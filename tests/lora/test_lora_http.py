"""LoRA over HTTP (issue 37): /generate's lora_path, the OpenAI routes' "BASE:ADAPTER" through the
official client, /v1/models, the admin routes /load_lora_adapter and /unload_lora_adapter with their
4xx, the adapter in the prefix cache's key (cached_tokens), and an unload that waits for the
requests under it.
"""

import threading
import time

import openai
import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.lora.conftest import hf_greedy

ADMIN = "admin-key-9876543210"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
PROMPT = [(7 * i + 11) % 30000 + 3 for i in range(40)]


@pytest.fixture(scope="module")
def server(tiny_model_dir, lora_adapters):
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        "--served-model-name",
        "tiny",
        "--num-threads",
        "1",
        "--kv-memory-gb",
        "0.05",
        "--enable-invariant-checks",
        "--max-lora-rank",
        "16",
        "--lora-target-modules",
        "all",
        "--lora-paths",
        f"a8={lora_adapters['a8'][0]}",
        env={"RADIXLM_ADMIN_API_KEY": ADMIN},
    )
    yield s
    s.stop()


def generate(server, ids, lora=None, n=8, **extra):
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        "lora_path": lora,
        **extra,
    }
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def post(server, path, body, headers=AS_ADMIN):
    return requests.post(server.url + path, json=body, headers=headers, timeout=120)


def test_generate_and_openai_routes_serve_the_adapter(server, lora_adapters, tiny_hf_model):
    ids = PROMPT[:9]
    ref = hf_greedy(lora_adapters["a8"][1], ids, 8)
    assert ref != hf_greedy(tiny_hf_model, ids, 8)
    out = generate(server, ids, "a8")
    assert out["output_ids"] == ref
    batch = requests.post(
        server.url + "/generate",
        json={
            "input_ids": [ids, ids],
            "lora_path": ["a8", None],
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        },
        timeout=60,
    )
    assert [o["output_ids"] for o in batch.json()] == [ref, hf_greedy(tiny_hf_model, ids, 8)]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    for model in ("tiny:a8", "a8"):  # SGLang's BASE:ADAPTER, and the adapter's own name
        c = client.completions.create(
            model=model, prompt=ids, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
        )
        assert c.choices[0].text == out["text"] and c.model == model
    cards = {m.id: m for m in client.models.list().data}
    assert list(cards) == ["tiny", "a8"]
    assert cards["a8"].root == lora_adapters["a8"][0] and cards["a8"].parent == "tiny"
    with pytest.raises(openai.NotFoundError, match="LoRA adapter 'zz'") as e:
        client.chat.completions.create(
            model="tiny:zz", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert e.value.body["param"] == "model"
    r = requests.post(
        server.url + "/generate", json={"input_ids": ids, "lora_path": "zz"}, timeout=60
    )
    assert r.status_code == 400 and "lora_path" in r.text and "'zz'" in r.text


def test_load_generate_unload_and_their_errors(server, lora_adapters):
    path = lora_adapters["b4"][0]
    assert post(
        server, "/load_lora_adapter", {"lora_name": "b4", "lora_path": path}, headers={}
    ).status_code in (401, 403)
    r = post(server, "/load_lora_adapter", {"lora_name": "b4", "lora_path": path})
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {
        "a8": lora_adapters["a8"][0],
        "b4": path,
    }
    ids = PROMPT[:12]
    assert generate(server, ids, "b4")["output_ids"] == hf_greedy(lora_adapters["b4"][1], ids, 8)
    r = post(server, "/load_lora_adapter", {"lora_name": "b4", "lora_path": path})
    assert r.status_code == 409 and r.json()["error"]["param"] == "lora_name"
    r = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": "/no/such/dir"})
    assert (
        r.status_code == 400
        and r.json()["error"]["param"] == "lora_path"
        and "/no/such/dir" in r.text
    )
    r = post(server, "/load_lora_adapter", {"lora_name": "x", "lora_path": path, "rank": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "rank"
    assert post(server, "/unload_lora_adapter", {"lora_name": "b4"}).status_code == 200
    r = requests.post(
        server.url + "/generate", json={"input_ids": ids, "lora_path": "b4"}, timeout=60
    )
    assert r.status_code == 400 and "lora_path" in r.text
    r = post(server, "/unload_lora_adapter", {"lora_name": "b4"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name"
    # Loaded again under the same name: served again.
    assert (
        post(server, "/load_lora_adapter", {"lora_name": "b4", "lora_path": path}).status_code
        == 200
    )
    assert generate(server, ids, "b4")["output_ids"] == hf_greedy(lora_adapters["b4"][1], ids, 8)
    assert generate(server, ids, "b4")["meta_info"]["cached_tokens"] > 0
    # The name reloaded with other weights: none of the KV cached under the old ones is read.
    assert post(server, "/unload_lora_adapter", {"lora_name": "b4"}).status_code == 200
    assert post(
        server, "/load_lora_adapter", {"lora_name": "b4", "lora_path": lora_adapters["c16"][0]}
    ).ok
    out = generate(server, ids, "b4")
    assert out["meta_info"]["cached_tokens"] == 0 and out["output_ids"] == hf_greedy(
        lora_adapters["c16"][1], ids, 8
    )
    assert post(server, "/unload_lora_adapter", {"lora_name": "b4"}).status_code == 200
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_cached_prefix_is_reused_only_under_the_same_adapter(server, lora_adapters):
    requests.post(server.url + "/flush_cache", headers=AS_ADMIN, timeout=30).raise_for_status()
    first = generate(server, PROMPT, "a8")
    assert first["meta_info"]["cached_tokens"] == 0
    again = generate(server, PROMPT, "a8")
    assert (
        again["meta_info"]["cached_tokens"] >= len(PROMPT) - 1
        and again["output_ids"] == first["output_ids"]
    )
    base = generate(
        server, PROMPT
    )  # the same tokens, the base model's KV: nothing of a8's is shared
    assert base["meta_info"]["cached_tokens"] == 0 and base["output_ids"] != first["output_ids"]
    assert generate(server, PROMPT)["meta_info"]["cached_tokens"] >= len(PROMPT) - 1


def test_unload_waits_for_the_requests_under_the_adapter(server):
    done = {}

    def long_request():
        done["sent"] = time.monotonic()
        done["out"] = generate(server, PROMPT[:5], "a8", n=400)
        done["t"] = time.monotonic()

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.3)
    sent = time.monotonic()
    assert post(server, "/unload_lora_adapter", {"lora_name": "a8"}).status_code == 200
    unloaded = time.monotonic()
    t.join(60)
    assert (
        len(done["out"]["output_ids"]) == 400
        and done["out"]["meta_info"]["finish_reason"]["type"] == "length"
    )
    # The unload came while it ran, and answered after it finished on the server: it finished no
    # earlier than its send plus the server's own e2e latency (received after the send, timed to
    # its last output). This thread's clock after the reply is no bound: it reads and parses the
    # reply after the server sent both, in either order.
    assert sent < done["t"]
    assert done["sent"] + done["out"]["meta_info"]["e2e_latency"] <= unloaded
