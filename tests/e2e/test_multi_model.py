"""Many models behind one server (`serve --model-path A --model-path B --models-max 1`): each
request gets its own model's greedy tokens (HF transformers' greedy as the reference), through
the native and the OpenAI APIs, streamed or not; the models swap (states in /v1/models, lines in
the log); concurrent requests to both complete; an unknown model is a 404 naming the choices;
nothing is left behind (no child process after an unload or the server's stop, the process tree's
memory back near where it started). `--models-dir` lists a GGUF file and a HF directory."""

import os
import threading
import time

import openai
import psutil
import pytest
import requests
import torch

from radixlm.errors import StartupRefusalError
from radixlm.server.process import ServerProcess
from tests.checkpoints import tiny_like
from tests.conftest import TINY_SERVE

N = 8
PROMPT = [1, 504, 3458, 282, 4649, 314]


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    """Two different tiny models, named by their directories: a Llama and a Qwen2 (another seed,
    another architecture)."""
    root = tmp_path_factory.mktemp("multi")
    os.symlink(tiny_model_dir, root / "llama-a")
    tiny_like(tiny_model_dir, str(root / "qwen-b"), seed=1, architecture="Qwen2ForCausalLM")
    return {"llama-a": str(root / "llama-a"), "qwen-b": str(root / "qwen-b")}


@pytest.fixture(scope="module")
def refs(models):
    """name -> (HF model, its greedy tokens after PROMPT)."""
    from transformers import AutoModelForCausalLM

    out = {}
    for name, path in models.items():
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        out[name] = (hf, hf_greedy(hf, PROMPT, N))
    assert out["llama-a"][1] != out["qwen-b"][1]  # the test tells the models apart
    return out


def hf_greedy(hf, ids, n):
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def front(models):
    s = ServerProcess(
        "--model-path",
        models["llama-a"],
        "--model-path",
        models["qwen-b"],
        "--models-max",
        "1",
        *TINY_SERVE,
        "--log-level",
        "info",
    )
    yield s
    s.stop()


def tree(pid):
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def tree_rss(pid) -> int:
    return sum(p.memory_info().rss for p in tree(pid))


def model_states(url) -> dict:
    data = requests.get(url + "/v1/models", timeout=10).json()["data"]
    return {m["id"]: m["status"] for m in data}


def generate(url, name) -> list[int]:
    r = requests.post(
        url + "/generate",
        json={
            "model": name,
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": N, "temperature": 0, "ignore_eos": True},
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_alternating_requests_get_their_own_models_tokens_and_swap(front, refs, models):
    from transformers import AutoTokenizer

    # qwen-b's HF tokens as text (the OpenAI API's answer): decoded by its tokenizer.
    b_text = AutoTokenizer.from_pretrained(models["qwen-b"]).decode(refs["qwen-b"][1])
    baseline = tree_rss(front.proc.pid)
    assert len(tree(front.proc.pid)) == 1  # nothing loaded before the first request
    assert values(front.url) == {"llama-a": "unloaded", "qwen-b": "unloaded"}
    assert generate(front.url, "llama-a") == refs["llama-a"][1]
    assert values(front.url) == {"llama-a": "loaded", "qwen-b": "unloaded"}
    # The OpenAI API, streamed, on the other model: its text is HF's tokens'.
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="none")
    stream = client.completions.create(
        model="qwen-b",
        prompt=PROMPT,
        max_tokens=N,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert len(chunks) > 1 and {c.model for c in chunks} == {"qwen-b"}
    assert "".join(c.choices[0].text for c in chunks) == b_text
    # Ollama's client through the front: its version, and a raw generate routed by its model
    # field to the loaded qwen-b, the OpenAI completion's text for the same prompt.
    import ollama

    from radixlm.version import __version__

    assert requests.get(front.url + "/api/version", timeout=10).json() == {"version": __version__}
    want = client.completions.create(model="qwen-b", prompt="a b c", max_tokens=N, temperature=0)
    got = ollama.Client(host=front.url).generate(
        model="qwen-b", prompt="a b c", raw=True, options={"temperature": 0, "num_predict": N}
    )
    assert want.choices[0].text and got.response == want.choices[0].text and got.model == "qwen-b"
    st = model_states(front.url)
    assert (st["llama-a"]["value"], st["llama-a"]["loads"]) == ("unloaded", 1)
    assert (st["qwen-b"]["value"], st["qwen-b"]["loads"]) == ("loaded", 1)
    assert "unloading model llama-a (least recently used; room for qwen-b)" in front.output()
    # One model's server at a time (--models-max 1): qwen-b's, with its engine processes.
    children = tree(front.proc.pid)[1:]
    assert children[0].pid == st["qwen-b"]["pid"] and len(children) >= 3
    loaded_rss = tree_rss(front.proc.pid)
    # Unloaded on request: no process left, the memory back near the start.
    r = requests.post(front.url + "/models/unload", json={"model": "qwen-b"}, timeout=10)
    assert r.json() == {"success": True, "model": "qwen-b", "status": "unloading"}
    wait_for(lambda: model_states(front.url)["qwen-b"]["value"] == "unloaded")
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive and len(tree(front.proc.pid)) == 1
    after = tree_rss(front.proc.pid)
    assert loaded_rss > baseline + 200 * 2**20  # a loaded model's processes weigh that much
    assert after < baseline + 64 * 2**20, (baseline, loaded_rss, after)


def values(url) -> dict:
    return {name: s["value"] for name, s in model_states(url).items()}


def wait_for(cond, timeout=30.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_concurrent_requests_to_both_models_complete(front, refs):
    seen = {"llama-a": set(), "qwen-b": set()}
    done = threading.Event()

    def watch():
        while not done.is_set():
            for name, s in model_states(front.url).items():
                seen[name].add(s["value"])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    results, errors = {}, []

    def one(i, name):
        try:
            results[i] = (name, generate(front.url, name))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [
        threading.Thread(target=one, args=(i, name))
        for i, name in enumerate(["llama-a", "qwen-b"] * 3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    done.set()
    watcher.join()
    assert not errors
    assert len(results) == 6
    for name, ids in results.values():
        assert ids == refs[name][1]
    # Both loaded in turn, each while requests waited for it; the first drained for the second.
    assert "loading" in seen["llama-a"] and "loading" in seen["qwen-b"]
    assert "draining (" in front.output()
    states = model_states(front.url)
    assert sorted(s["value"] for s in states.values()) == ["loaded", "unloaded"]
    assert all(s["in_flight"] == 0 for s in states.values())


def test_unknown_or_missing_model(front):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="none")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert e.value.body["param"] == "model"
    assert "'nope' not found" in e.value.message
    assert "llama-a, qwen-b" in e.value.message
    r = requests.post(front.url + "/api/chat", json={"model": "nope", "messages": []}, timeout=10)
    assert r.status_code == 404
    assert r.json() == {"error": "model 'nope' not found; this server's models: llama-a, qwen-b"}
    r = requests.post(front.url + "/generate", json={"text": "hi"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_nothing_left_after_the_server_stops(front):
    """Last of the module's tests on `front`: stopped (SIGTERM) with a model loaded."""
    assert sorted(values(front.url).values()) == ["loaded", "unloaded"]
    procs = tree(front.proc.pid)[1:]
    assert len(procs) >= 3  # a model's HTTP server, scheduler and detokenizer
    assert front.stop() == 128 + 15  # SIGTERM's exit, as a single-model server's
    gone, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive


def test_models_dir_lists_a_gguf_file_and_a_hf_directory(
    tmp_path, default_model_path, tiny_model_dir
):
    os.symlink(default_model_path, tmp_path / "smollm2.gguf")
    os.symlink(tiny_model_dir, tmp_path / "tiny-llama")
    (tmp_path / "notes.txt").write_text("not a model")
    s = ServerProcess("--models-dir", str(tmp_path), *TINY_SERVE)
    try:
        cards = requests.get(s.url + "/v1/models", timeout=10).json()["data"]
        assert [(c["id"], c["root"], c["status"]["value"]) for c in cards] == [
            ("smollm2", str(tmp_path / "smollm2.gguf"), "unloaded"),
            ("tiny-llama", str(tmp_path / "tiny-llama"), "unloaded"),
        ]
        import ollama

        listed = ollama.Client(host=s.url).list().models
        assert [(m.model, m.details.format, m.size) for m in listed] == [
            ("smollm2", "gguf", os.path.getsize(default_model_path)),
            (
                "tiny-llama",
                "safetensors",
                sum(f.stat().st_size for f in (tmp_path / "tiny-llama").iterdir()),
            ),
        ]
        assert listed[1].details.family == "llama"
    finally:
        s.stop()


def test_served_model_name_is_refused_with_several_models(models):
    with pytest.raises(StartupRefusalError, match="served_model_name"):
        ServerProcess(
            "--model-path",
            models["llama-a"],
            "--model-path",
            models["qwen-b"],
            "--served-model-name",
            "x",
        )
