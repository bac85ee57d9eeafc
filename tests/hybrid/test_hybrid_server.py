"""A hybrid model behind the HTTP server: turn 2 of a chat through the official OpenAI client and
through /generate reuses turn 1 (usage.prompt_tokens_details.cached_tokens,
meta_info.cached_tokens) and answers HF's tokens; the options SGLang users set are taken, and
what a hybrid cannot be served with is refused at start-up in one line."""

from __future__ import annotations

import time

import pytest
import requests
import torch

from radixlm.server.process import ServerProcess
from tests.conftest import TINY_SERVE
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.forked_servers import run_cli


@pytest.fixture(scope="module")
def qwen3_5(hybrid_checkpoint_dir):
    return hybrid_checkpoint_dir("qwen35")


@pytest.fixture(scope="module")
def server(qwen3_5):
    s = ServerProcess(
        "--model-path",
        qwen3_5,
        "--quantization",
        "none",
        "--max-mamba-cache-size",
        "32",
        "--mamba-track-interval",
        "128",
        "--mamba-ssm-dtype",
        "float32",
        "--linear-attn-backend",
        "torch",
        *TINY_SERVE,
    )
    yield s
    s.stop()


def test_chat_turn_two_reuses_turn_one_through_openai(server):
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Tell me about radix trees. " * 20}]
    one = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0
    )
    messages += [
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "And their prefixes?"},
    ]
    two = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0
    )
    cached = two.usage.prompt_tokens_details.cached_tokens
    assert cached >= one.usage.prompt_tokens, (cached, one.usage.prompt_tokens)
    assert cached < two.usage.prompt_tokens


def test_generate_turn_two_answers_hf_tokens(server, qwen3_5):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(qwen3_5, dtype=torch.float32).eval()
    prompt = list(range(300, 700))  # 400 tokens: snapshots at 128, 256, 384 and its end
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    one = requests.post(f"{server.url}/generate", json=body, timeout=60).json()
    turn2 = prompt + one["output_ids"] + [5, 6, 7]
    body["input_ids"] = turn2
    two = requests.post(f"{server.url}/generate", json=body, timeout=60).json()
    assert two["meta_info"]["cached_tokens"] >= len(prompt) + 7
    with torch.no_grad():
        out = hf.generate(torch.tensor([turn2]), max_new_tokens=8, do_sample=False)
        gen = out[0, len(turn2) :].tolist()
        logits = hf(torch.tensor([turn2 + gen])).logits[0, len(turn2) - 1 :]
    assert_greedy_equal(two["output_ids"], (turn2, gen, logits), "turn 2 over /generate")
    info = requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_state"]
    assert info["state_snapshot_slots"] == 32 - info["state_rows"]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--speculative-algorithm", "draft-model"], "a hybrid model (recurrent state layers)"),
        (
            ["--enable-hierarchical-cache", "--hicache-storage-backend", "file"],
            "--hicache-storage-backend: a hybrid model's state snapshots have no storage tier",
        ),
    ],
)
def test_refused_options_say_why_in_one_line(qwen3_5, flags, says):
    if "draft-model" in flags:  # the hybrid as its own draft model
        flags = [*flags, "--speculative-draft-model-path", qwen3_5]
    proc = run_cli(["serve", "--model-path", qwen3_5, "--port", "1", *TINY_SERVE, *flags])
    assert proc.returncode != 0
    assert says in proc.stderr, proc.stderr[-2000:]


def test_a_client_that_disconnects_leaves_nothing_behind(server):
    """A streaming request dropped mid-answer is aborted: its state slot and snapshot tracks go
    back, the server keeps serving, and a flushed cache has every KV and state slot free."""
    body = {
        "input_ids": list(range(200, 600)),
        "sampling_params": {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first chunk: the request is running, then the client leaves
    ok = requests.post(
        f"{server.url}/generate",
        json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}},
        timeout=60,
    )
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 4
    for _ in range(50):  # the abort lands within a few steps
        info = requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_state"]
        if info["num_running"] == 0:
            break
        time.sleep(0.2)
    assert info["num_running"] == 0
    assert requests.post(f"{server.url}/flush_cache", timeout=10).status_code == 200
    info = requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_state"]
    assert info["available_kv_tokens"] == info["max_total_num_tokens"]
    assert info["state_snapshot_slots_free"] == info["state_snapshot_slots"]
    assert info["req_slots_free"] == info["req_slots_total"]
