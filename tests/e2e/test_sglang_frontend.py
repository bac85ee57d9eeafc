"""SGLang's own frontend against `radixlm serve`, unchanged: its RuntimeEndpoint sends SGLang 0.5's
sampling keys (stop_regex and the rest, unset ones as null) and SGLang programs (gen, multi-turn
roles, regex, JSON, typed gen, fork/join, select, stop_regex, streaming, run_batch) run through
it. Each result is checked against the same request sent to the native API by hand (and
jsonschema / re.fullmatch for the constrained ones)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import requests

PROGRAMS = Path(__file__).with_name("sglang_programs.py")
sys.path.insert(0, str(PROGRAMS.parent))
from sglang_programs import (  # noqa: E402 (after the sys.path insert above)
    CITY_SCHEMA,
    IP_REGEX,
)


@pytest.fixture(scope="module")
def results(server):
    # The frontend runs in its own process, as a user's program does (whatever this process has
    # imported: another test may have imported sglang here).
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS), server.url], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def native(server, text, **sp):
    r = requests.post(
        server.url + "/generate",
        json={"text": text, "sampling_params": {"temperature": 0, **sp}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()["text"]


def test_gen_stream_and_run_batch(server, results):
    answer = native(server, "The capital of France is", max_new_tokens=16)
    assert results["plain"]["answer"] == answer and answer
    assert "".join(results["stream"]["chunks"]) == answer and len(results["stream"]["chunks"]) > 3
    questions = ("The capital of France is", "Two plus two is", "The largest ocean is")
    assert results["batch"] == [native(server, q, max_new_tokens=16) for q in questions]


def test_multi_turn_roles(server, results):
    mt = results["multi_turn"]
    assert [m["role"] for m in mt["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    text = mt["text"]
    for key in ("a1", "a2"):  # each answer is what the native API generates for the text before it
        before = text[: text.index(mt[key])]
        assert native(server, before, max_new_tokens=12) == mt[key]


def test_regex_json_and_typed_gen(server, results):
    ip = results["regex"]["ip"]
    assert re.fullmatch(IP_REGEX, ip)
    assert ip == native(
        server, "The IP address of the Google DNS server is ", max_new_tokens=24, regex=IP_REGEX
    )
    jsonschema.validate(json.loads(results["json"]["json"]), CITY_SCHEMA)
    assert re.fullmatch(r"[-+]?[0-9]+[ \n]*", results["typed"]["legs"])


def test_fork_join(server, results):
    text = results["fork"]["text"]
    head = "Here are two tips for better sleep.\n"
    tip1, tip2 = re.fullmatch(re.escape(head) + r"Tip 1:(.*)\nTip 2:(.*)", text, re.S).groups()
    assert tip1 == native(server, head + "Tip 1:", max_new_tokens=12, stop="\n")
    assert tip2 == native(server, head + "Tip 2:", max_new_tokens=12, stop="\n")


def test_select_follows_the_prompt_logprobs(server, results):
    sel = results["select"]
    choices = ["blue", "green", "red"]
    norm = sel["meta"]["normalized_prompt_logprobs"]
    assert len(norm) == len(sel["meta"]["input_token_logprobs"]) == len(choices)
    assert sel["color"] == choices[max(range(3), key=lambda i: norm[i])]
    prompt = "Q: What color is the sky on a clear day?\nA: "
    for c, lps in zip(choices, sel["meta"]["input_token_logprobs"]):
        r = requests.post(
            server.url + "/generate",
            json={
                "text": prompt + c,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": 0,
            },
            timeout=60,
        ).json()
        direct = r["meta_info"]["input_token_logprobs"]
        assert [t[1] for t in lps] == [t[1] for t in direct[-len(lps) :]]
        assert [t[0] for t in lps] == pytest.approx([t[0] for t in direct[-len(lps) :]], abs=1e-4)


def test_stop_regex(server, results):
    prompt = "Count: 1, 2, 3, 4,"
    full = native(server, prompt, max_new_tokens=30)
    m = re.search(r" [6-9],", full)
    assert m is not None, full
    assert results["stop_regex"]["count"] == full[: m.start()]
