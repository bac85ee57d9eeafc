"""`radixlm serve` (and the Engine) given Hugging Face model ids: a tiny random model placed in an
HF cache in a temporary HF_HOME loads by its id with HF_HUB_OFFLINE=1 and answers as the same model
served by its path; a GGUF repo id with llama-server's `:Q8_0` picks that file among several; a
wrong
--revision, a missing model and an unreachable Hub are one `radixlm: error:` line each (exit 2)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.conftest import engine_args
from tests.hf_cache import dir_files, put_in_hf_cache

TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
PROMPTS = ["The capital of France is", "1, 2, 3,", "Once upon a time"]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
# Files of a GGUF repo, each random weights of its own (a wrong pick answers differently).
GGUFS = {"tiny-F16.gguf": ("f16", 1), "tiny-Q4_0.gguf": ("q4_0", 2), "tiny-Q8_0.gguf": ("q8_0", 3)}


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory, tiny_model_dir):
    from benchmarks.make_random_gguf import write_random_gguf

    home = tmp_path_factory.mktemp("hf-home")
    put_in_hf_cache(str(home / "hub"), "org/tiny-llama", dir_files(tiny_model_dir))
    src = tmp_path_factory.mktemp("ggufs")
    for name, (kind, seed) in GGUFS.items():
        write_random_gguf(str(src / name), "tiny", kind, seed=seed, std=0.25, log=None)
    put_in_hf_cache(str(home / "hub"), "org/tiny-GGUF", {n: str(src / n) for n in GGUFS})
    return str(home)


def offline(home: str) -> dict:
    return {"HF_HOME": home, "HF_HUB_OFFLINE": "1"}


def greedy(server) -> list[list[int]]:
    outs = []
    for p in PROMPTS:
        r = requests.post(
            server.url + "/generate", json={"text": p, "sampling_params": GREEDY}, timeout=120
        )
        assert r.status_code == 200, r.text
        outs.append(r.json())
    return outs


def test_hub_id_serves_as_its_path(hf_home, tiny_server):
    by_id = ServerProcess(
        "--model-path",
        "org/tiny-llama",
        "--tokenizer-path",
        "org/tiny-llama",
        "--speculative-algorithm",
        "draft-model",
        "--speculative-draft-model-path",
        "org/tiny-llama",
        "--speculative-draft-policy",
        "fixed",
        *TINY,
        env=offline(hf_home),
    )
    try:
        got = greedy(by_id)
        info = requests.get(by_id.url + "/get_model_info", timeout=30).json()
        models = requests.get(by_id.url + "/v1/models", timeout=30).json()["data"]
    finally:
        by_id.stop()
    want = greedy(tiny_server)  # the same model by its path: the run's shared tiny-model server
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert [o["text"] for o in got] == [o["text"] for o in want]
    # The draft model came from the cache too: every step verified its drafts (itself: all
    # accepted).
    assert all(
        o["meta_info"]["spec_verify_ct"] > 0 and o["meta_info"]["spec_accepted_tokens"] > 0
        for o in got
    )
    snapshots = os.path.join(hf_home, "hub", "models--org--tiny-llama", "snapshots")
    assert info["model_path"].startswith(snapshots) and info["tokenizer_path"].startswith(snapshots)
    assert [m["id"] for m in models] == ["org/tiny-llama"]  # SGLang's served name: the id


def test_gguf_repo_quant_tag_picks_that_file(hf_home):
    from huggingface_hub import hf_hub_download

    want_path = hf_hub_download(
        "org/tiny-GGUF",
        "tiny-Q8_0.gguf",
        cache_dir=os.path.join(hf_home, "hub"),
        local_files_only=True,
    )
    by_tag = ServerProcess(
        "--model-path", "org/tiny-GGUF:q8_0", *TINY, env=offline(hf_home)
    )  # any case
    try:
        got = greedy(by_tag)
        info = requests.get(by_tag.url + "/get_model_info", timeout=30).json()
    finally:
        by_tag.stop()
    by_path = ServerProcess("--model-path", want_path, *TINY)
    try:
        want = greedy(by_path)
    finally:
        by_path.stop()
    assert info["model_path"] == want_path
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]


# `python -m radixlm.cli` with huggingface_hub's backoff not sleeping (its retries still run): an
# unreachable Hub otherwise costs its 1 + 2 + 4 + 8 + 8 s of waiting per request.
NO_BACKOFF_SLEEP = (
    "import sys, time, types, runpy; import huggingface_hub.utils._http as h;"
    " h.time = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time)"
    " if not n.startswith('__')}); h.time.sleep = lambda s: None;"
    " runpy.run_module('radixlm.cli', run_name='__main__', alter_sys=True)"
)


def serve_error(
    env: dict, *args: str, notices: tuple[str, ...] = (), backoff_sleeps: bool = True
) -> str:
    """`radixlm serve ARGS` that must fail before starting anything: its one error line (stderr
    holds nothing else but huggingface_hub's lines containing one of `notices`)."""
    python = [
        sys.executable,
        *(["-m", "radixlm.cli"] if backoff_sleeps else ["-c", NO_BACKOFF_SLEEP]),
    ]
    p = subprocess.run(
        [*python, "serve", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and p.stdout == ""
    *before, last = p.stderr.strip().splitlines()
    assert last.startswith("radixlm: error: ") and "radixlm: error" not in "".join(before), p.stderr
    assert all(any(n in line for n in notices) for line in before), p.stderr
    return last


def test_wrong_revision_and_missing_model_are_one_clear_error(hf_home):
    line = serve_error(
        offline(hf_home), "--model-path", "org/tiny-llama", "--revision", "no-such-branch"
    )
    assert (
        "--model-path org/tiny-llama" in line
        and "revision 'no-such-branch'" in line
        and "it has main = " in line
    )
    assert "`hf download org/tiny-llama --revision no-such-branch`" in line
    line = serve_error(offline(hf_home), "--model-path", "org/absent-model")
    assert "HF_HUB_OFFLINE" in line and "`hf download org/absent-model`" in line
    line = serve_error(offline(hf_home), "--model-path", "org/tiny-GGUF:Q5_K_M")
    assert "matching :Q5_K_M" in line and "tiny-Q4_0.gguf" in line


class FakeHub(http.server.BaseHTTPRequestHandler):
    """A Hub that knows no repo, and of org/known no revision (huggingface_hub reads
    X-Error-Code)."""

    def do_GET(self):
        self.send_response(404)
        self.send_header(
            "X-Error-Code", "RevisionNotFound" if "/org/known/" in self.path else "RepoNotFound"
        )
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "not found"}')

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_online_failures_are_one_clear_error(hf_home):
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    online = {
        "HF_HOME": hf_home,
        "HF_HUB_OFFLINE": "0",
        "HF_ENDPOINT": f"http://127.0.0.1:{hub.server_port}",
    }
    try:
        line = serve_error(online, "--model-path", "org/absent-model")
        assert "--model-path org/absent-model: no such model on the Hugging Face Hub" in line
        line = serve_error(online, "--model-path", "org/known", "--revision", "v9")
        assert "the Hub has no revision 'v9' of org/known" in line
    finally:
        hub.shutdown()
    # The Hub out of reach (a closed local port): huggingface_hub's retries, then the cause and the
    # way out.
    line = serve_error(
        {**online, "HF_ENDPOINT": "http://127.0.0.1:9"},
        "--model-path",
        "org/absent-model",
        notices=("thrown while requesting", "Retrying in"),
        backoff_sleeps=False,
    )
    assert "could not be downloaded (ConnectError" in line and "HF_HUB_OFFLINE=1" in line


def test_engine_takes_a_hub_id(hf_home, tiny_hf_model, monkeypatch):
    import torch

    from radixlm import Engine

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids = [5, 17, 300, 42, 7]
    ref = tiny_hf_model.generate(
        torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(ids) :].tolist()
    with Engine(
        "org/tiny-llama", **engine_args(download_dir=os.path.join(hf_home, "hub"))
    ) as engine:
        out = engine.generate(
            input_ids=ids,
            sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        )
        assert engine.server_args.model_path.startswith(
            os.path.join(hf_home, "hub", "models--org--tiny-llama")
        )
    assert out["output_ids"] == ref
