"""--log-requests with SGLang's levels (0: metadata; 1: + sampling params; 2: + inputs and outputs
cut to 2048; 3: everything) and formats (text, json), switched at run time by the admin's
/configure_logging; no API key and no cache_salt in any line of the server's output."""

import json

import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.forked_servers import run_cli

USER, ADMIN = "user-key-0123456789", "admin-key-9876543210"
SALT = "tenant-salt-that-must-stay-secret"
TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")
# Past 2048 characters, with a marker in the middle that level 2's cut (first and last 1024) drops.
PROMPT = "BEGINMARK " + "alpha beta " * 100 + "MIDMARK " + "gamma delta " * 100 + "ENDMARK"
SAMPLING = {"max_new_tokens": 4, "temperature": 0.123456, "ignore_eos": True}


def as_(key):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    # Keys on the command line: the strictest case for "never logged".
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        *TINY,
        "--log-requests",
        "--log-requests-level",
        "0",
        "--api-key",
        USER,
        "--admin-api-key",
        ADMIN,
    )
    yield s
    s.stop()


def _events(server, rid: str) -> dict:
    """The json-format lines about request `rid`, by event."""
    out = {}
    for line in server.output().splitlines():
        if line.startswith("{") and f'"rid": "{rid}"' in line:
            ev = json.loads(line)
            out[ev["event"]] = ev
    return out


def _generate(server, rid: str) -> dict:
    body = {"text": PROMPT, "sampling_params": SAMPLING, "rid": rid, "cache_salt": SALT}
    r = requests.post(server.url + "/generate", json=body, headers=as_(USER), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_text_format_at_the_start_up_level(server):
    """--log-requests-level 0 (text, the default format): SGLang's Receive / Finish lines, metadata
    only."""
    out = _generate(server, "text-0")
    lines = [ln for ln in server.output().splitlines() if "rid='text-0'" in ln]
    assert [ln.split(":", 1)[0] for ln in lines] == ["Receive", "Finish"]
    assert lines[0].startswith("Receive: obj=GenerateReqInput(") and "cache_salt='***'" in lines[0]
    assert f"'completion_tokens': {out['meta_info']['completion_tokens']}" in lines[1]
    for ln in lines:
        assert (
            "MARK" not in ln
            and "sampling_params" not in ln
            and "output_ids" not in ln
            and "'text'" not in ln
        )


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_each_level_logs_what_sglang_says(server, level):
    r = requests.post(
        server.url + "/configure_logging",
        json={"log_requests_level": level, "log_requests_format": "json"},
        headers=as_(ADMIN),
        timeout=10,
    )
    assert r.status_code == 200 and r.json() == {
        "log_requests": True,
        "log_requests_level": level,
        "log_requests_format": "json",
    }
    rid = f"json-{level}"
    out = _generate(server, rid)
    ev = _events(server, rid)
    received, finished = ev["request.received"], ev["request.finished"]
    for e in (received, finished):
        assert e["rid"] == e["obj"]["rid"] == rid and e["obj"]["cache_salt"] == "***"
    meta = finished["out"]["meta_info"]
    assert meta["id"] == rid and meta["prompt_tokens"] == out["meta_info"]["prompt_tokens"]
    assert meta["completion_tokens"] == out["meta_info"]["completion_tokens"] == 4
    obj, logged_out = received["obj"], finished["out"]
    if level == 0:
        assert not {"text", "input_ids", "sampling_params"} & set(obj)
    else:
        assert obj["sampling_params"] == SAMPLING
    if level <= 1:
        assert not {"text", "input_ids"} & set(obj) and not {"text", "output_ids"} & set(logged_out)
    else:
        assert logged_out["text"] == out["text"] and logged_out["output_ids"] == out["output_ids"]
    if level == 2:
        assert len(PROMPT) > 2048 and obj["text"] == PROMPT[:1024] + "..." + PROMPT[-1024:]
        assert "MIDMARK" not in obj["text"]
    if level == 3:
        assert obj["text"] == PROMPT


def test_failures_openai_requests_and_switching_off(server):
    requests.post(
        server.url + "/configure_logging",
        json={"log_requests_level": 3, "log_requests_format": "json"},
        headers=as_(ADMIN),
        timeout=10,
    )
    r = requests.post(
        server.url + "/generate",
        json={"text": "hi", "rid": "too-long", "sampling_params": {"max_new_tokens": 10**6}},
        headers=as_(USER),
        timeout=30,
    )
    assert r.status_code == 400
    failed = _events(server, "too-long")["request.failed"]
    assert "max_new_tokens" in failed["error"] and failed["obj"]["text"] == "hi"
    chat = requests.post(
        server.url + "/v1/chat/completions",
        headers=as_(USER),
        timeout=60,
        json={"messages": [{"role": "user", "content": "a chat message to log"}], "max_tokens": 3},
    )
    assert chat.status_code == 200
    rid = chat.json()["id"].removeprefix("chatcmpl-")
    logged = [
        json.loads(ln)
        for ln in server.output().splitlines()
        if ln.startswith("{") and "a chat message to log" in ln
    ]
    assert {e["event"] for e in logged} == {"request.received", "request.finished"}
    assert [e["rid"] for e in logged] == [rid, rid]
    # The route sends the rendered chat as input_ids; the log shows them as text too (SGLang's,
    # level >= 2).
    assert all(
        "a chat message to log" in e["obj"]["text"] and e["obj"]["input_ids"] for e in logged
    )
    # Off: nothing more is logged.
    r = requests.post(
        server.url + "/configure_logging",
        json={"log_requests": False},
        headers=as_(ADMIN),
        timeout=10,
    )
    assert r.json()["log_requests"] is False
    _generate(server, "after-off")
    assert "after-off" not in server.output()


def test_configure_logging_is_an_admin_action_with_checked_fields(server):
    r = requests.post(
        server.url + "/configure_logging",
        json={"log_requests_level": 1},
        headers=as_(USER),
        timeout=10,
    )
    assert r.status_code == 403
    for body, field in [
        ({"log_requests_level": 4}, "log_requests_level"),
        ({"log_requests_format": "xml"}, "log_requests_format"),
        ({"log_requests": "yes"}, "log_requests"),
        ({"dump_requests_folder": "/x"}, "dump_requests_folder"),
    ]:
        r = requests.post(
            server.url + "/configure_logging", json=body, headers=as_(ADMIN), timeout=10
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (body, r.text)


def test_no_key_and_no_salt_in_the_output(server):
    text = server.output()
    assert "Receive" in text and "request.finished" in text  # the log ran
    for secret in (USER, ADMIN, SALT):
        assert secret not in text


def test_bad_start_up_values_are_refused(tiny_model_dir):

    for flags, why in [
        (["--log-requests-level", "4"], "invalid choice: 4"),
        (["--log-requests-format", "xml"], "invalid choice: 'xml'"),
    ]:
        p = run_cli(["serve", "--model-path", tiny_model_dir, *flags], timeout=60)
        assert p.returncode == 2 and why in p.stderr and "Traceback" not in p.stderr
