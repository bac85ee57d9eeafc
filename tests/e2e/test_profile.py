"""SGLang's /start_profile and /stop_profile (and Engine.start_profile / stop_profile): a torch
profiler trace of the scheduler process, written as gzipped Chrome JSON, holding the model's own ops
(their shapes checked against the checkpoint's config.json and their count against the forward
passes the requests report); an admin action; SGLang's fields (output_dir, num_steps, activities,
...) and RADIXLM_TORCH_PROFILER_DIR."""

import gzip
import json
import os
from collections import Counter

import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.conftest import engine_args

USER, ADMIN = "user-key-0123456789", "admin-key-9876543210"
TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")


def as_(key):
    return {"Authorization": f"Bearer {key}"}


def _ops(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)  # Chrome's trace format
    return [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]


def _check_model_ops(path: str, model_dir: str, forward_passes: int) -> None:
    """The trace's ops are this model's: one embedding of its [vocab, hidden] table per forward
    pass, one attention per layer and pass."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    ops = _ops(path)
    names = Counter(e["name"] for e in ops)
    embeddings = [e for e in ops if e["name"] == "aten::embedding"]
    assert embeddings and all(
        e["args"]["Input Dims"][0] == [cfg["vocab_size"], cfg["hidden_size"]] for e in embeddings
    )
    assert len(embeddings) == forward_passes
    assert names["radixlm::paged_attention"] == cfg["num_hidden_layers"] * forward_passes


def _generate(url: str, text: str) -> dict:
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
    }
    r = requests.post(url + "/generate", json=body, headers=as_(USER), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    env_dir = tmp_path_factory.mktemp("env-profiles")
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        *TINY,
        env={
            "RADIXLM_API_KEY": USER,
            "RADIXLM_ADMIN_API_KEY": ADMIN,
            "RADIXLM_TORCH_PROFILER_DIR": str(env_dir),
        },
    )
    s.env_dir = env_dir
    yield s
    s.stop()


def test_start_requests_stop_writes_a_trace_of_the_model(server, tiny_model_dir, tmp_path):
    out_dir = tmp_path / "profiles"
    r = requests.post(
        server.url + "/start_profile",
        json={"output_dir": str(out_dir), "profile_prefix": "run1"},
        headers=as_(ADMIN),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    outs = [
        _generate(server.url, t) for t in ("The first prompt", "A second, longer prompt to profile")
    ]
    r = requests.post(server.url + "/stop_profile", headers=as_(ADMIN), timeout=120)
    assert r.status_code == 200, r.text
    files = sorted(os.listdir(out_dir))
    assert (
        len(files) == 1
        and files[0].startswith("run1-")
        and files[0].endswith("-TP-0.trace.json.gz")
    )
    assert str(out_dir / files[0]) in r.text
    _check_model_ops(
        str(out_dir / files[0]), tiny_model_dir, sum(o["meta_info"]["forward_passes"] for o in outs)
    )
    # Nothing in progress any more: a second stop is a client error, and the server goes on.
    again = requests.post(server.url + "/stop_profile", headers=as_(ADMIN), timeout=30)
    assert again.status_code == 400 and "not in progress" in again.json()["error"]["message"]
    _generate(server.url, "still serving")


def test_num_steps_stops_by_itself_in_the_environment_directory(server, tiny_model_dir):
    """No output_dir: RADIXLM_TORCH_PROFILER_DIR (SGLang's SGLANG_TORCH_PROFILER_DIR role);
    num_steps: the trace covers that many forward steps and is written with no /stop_profile."""
    before = set(os.listdir(server.env_dir))
    r = requests.post(
        server.url + "/start_profile",
        json={"num_steps": 3, "activities": ["CPU"]},
        headers=as_(ADMIN),
        timeout=30,
    )
    assert r.status_code == 200, r.text
    _generate(server.url, "five forward passes, three of them profiled")
    new = sorted(set(os.listdir(server.env_dir)) - before)
    assert len(new) == 1 and new[0].endswith("-TP-0.trace.json.gz")
    _check_model_ops(str(server.env_dir / new[0]), tiny_model_dir, 3)
    stop = requests.post(server.url + "/stop_profile", headers=as_(ADMIN), timeout=30)
    assert stop.status_code == 400


def test_profiling_is_an_admin_action_with_checked_fields(server, tmp_path):
    for path in ("/start_profile", "/stop_profile"):
        r = requests.post(
            server.url + path, json={"output_dir": str(tmp_path)}, headers=as_(USER), timeout=30
        )
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert (
            requests.get(server.url + path, headers=as_(ADMIN), timeout=30).status_code == 405
        )  # POST only
    bad = [
        ({"num_steps": 0}, "num_steps"),
        ({"activities": ["RPD"]}, "activities"),
        ({"activities": ["GPU"]}, "activities"),
        ({"profile_by_stage": True}, "profile_by_stage"),
        ({"output_dir": 7}, "output_dir"),
        ({"profile_prefix": "../x"}, "profile_prefix"),
        ({"steps": 2}, None),
    ]
    for body, field in bad:
        r = requests.post(server.url + "/start_profile", json=body, headers=as_(ADMIN), timeout=30)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == field and (field or "steps") in err["message"], (body, err)
    assert os.listdir(tmp_path) == []  # nothing started, nothing written
    # An empty POST (SGLang's `curl -X POST .../start_profile`) starts with the defaults.
    before = set(os.listdir(server.env_dir))
    assert (
        requests.post(server.url + "/start_profile", headers=as_(ADMIN), timeout=30).status_code
        == 200
    )
    again = requests.post(server.url + "/start_profile", headers=as_(ADMIN), timeout=30)
    assert again.status_code == 400 and "already in progress" in again.json()["error"]["message"]
    assert (
        requests.post(server.url + "/stop_profile", headers=as_(ADMIN), timeout=60).status_code
        == 200
    )
    assert (
        len(set(os.listdir(server.env_dir)) - before) == 1
    )  # no forward step ran: a trace all the same
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    r = requests.post(
        server.url + "/start_profile",
        json={"output_dir": str(blocked / "sub")},
        headers=as_(ADMIN),
        timeout=30,
    )
    assert r.status_code == 400 and "output_dir" in r.json()["error"]["message"]
    _generate(server.url, "the server goes on")


def test_engine_start_and_stop_profile(tiny_model_dir, tmp_path):
    from radixlm import Engine

    # Overlap scheduling: the forward runs on a worker thread, which the trace must cover too.
    with Engine(tiny_model_dir, **engine_args(enable_overlap_schedule=True)) as engine:
        assert "traces go to" in engine.start_profile(output_dir=str(tmp_path))
        out = engine.generate("Profiled from Python", {"max_new_tokens": 4, "temperature": 0})
        message = engine.stop_profile()
        (name,) = os.listdir(tmp_path)
        assert str(tmp_path / name) in message
        _check_model_ops(str(tmp_path / name), tiny_model_dir, out["meta_info"]["forward_passes"])
        with pytest.raises(RuntimeError, match="not in progress"):
            engine.stop_profile()
        with pytest.raises(ValueError, match="num_steps"):
            engine.start_profile(num_steps=-1)
