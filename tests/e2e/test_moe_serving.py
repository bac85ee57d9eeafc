"""A MoE model served end to end (Qwen2-MoE: shared expert, 8 experts, top-2; random weights with
SmolLM2's tokenizer): `--tp-size 2 --ep-size 2` answers the official openai client with the single
server's greedy completions; /metrics counts the tokens routed to each expert of each layer
(top_k per forwarded token); a bad --ep-size is a start-up error naming it."""

from __future__ import annotations

import re

import openai
import pytest
import requests

from radixlm import Engine
from radixlm.server.process import ServerProcess
from tests.conftest import engine_args
from tests.model.moe_checkpoints import hf_model

TINY = (
    "--num-threads",
    "1",
    "--kv-memory-gb",
    "0.05",
    "--enable-invariant-checks",
    "--enable-metrics",
)
PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time, " * 8]


@pytest.fixture(scope="module")
def tiny_moe_dir(tmp_path_factory, default_model_path):
    from radixlm.model.loader import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-qwen2-moe")
    tok = load_tokenizer(default_model_path)
    hf_model("qwen2_moe", vocab_size=len(tok), max_position_embeddings=1024).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _expert_tokens(url: str) -> dict[tuple[str, str], float]:
    text = requests.get(url + "/metrics", timeout=30).text
    pat = re.compile(r'^radixlm:moe_expert_tokens_total\{expert="(\d+)",layer="(\d+)"\} (\S+)$')
    return {
        (m.group(2), m.group(1)): float(m.group(3))
        for line in text.splitlines()
        if (m := pat.match(line))
    }


def _completions(url: str) -> list[str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    return [
        client.completions.create(model="default", prompt=p, max_tokens=16, temperature=0)
        .choices[0]
        .text
        for p in PROMPTS
    ]


@pytest.fixture(scope="module")
def single(tiny_moe_dir):
    """One stage, one rank: the reference for --ep-size 2 and for --pp-size 2."""
    s = ServerProcess("--model-path", tiny_moe_dir, *TINY)
    yield s
    s.stop()


def test_ep2_server_matches_single_server_and_counts_expert_load(tiny_moe_dir, single):
    want = _completions(single.url)
    ep = ServerProcess("--model-path", tiny_moe_dir, "--tp-size", "2", "--ep-size", "2", *TINY)
    try:
        assert requests.get(ep.url + "/get_server_info", timeout=30).json()["tp_size"] == 2
        assert _completions(ep.url) == want
        before = _expert_tokens(ep.url)
        assert sorted({layer for layer, _ in before}) == ["0", "1"] and len(before) == 16
        client = openai.OpenAI(base_url=ep.url + "/v1", api_key="none")
        r = client.completions.create(
            model="default",
            prompt="A fresh prompt about experts and routing",
            max_tokens=5,
            temperature=0,
        )
        details = r.usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details is not None else 0
        forwarded = (
            r.usage.prompt_tokens - cached + r.usage.completion_tokens - 1
        )  # the last token is not run
        after = _expert_tokens(ep.url)
        for layer in ("0", "1"):
            routed = sum(after[(layer, str(e))] - before.get((layer, str(e)), 0) for e in range(8))
            assert routed == 2 * forwarded, (layer, routed, forwarded)  # top-2
    finally:
        ep.stop()


def test_bad_ep_size_is_a_start_up_error(tiny_moe_dir):
    with pytest.raises(ValueError, match="ep_size must be 1 or tp_size"):
        Engine(tiny_moe_dir, **engine_args(tp_size=2, ep_size=3))


@pytest.mark.parametrize("flag", ["--ep-size", "--expert-parallel-size", "--ep"])
def test_sglang_spellings_of_ep_size(flag):
    import argparse

    from radixlm.config import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert ServerArgs.from_cli_args(parser.parse_args([flag, "2", "--tp-size", "2"])).ep_size == 2


def test_pipeline_stages_of_a_moe_model_match_one_stage(tiny_moe_dir, single):
    """--pp-size 2: each stage builds and loads its own layer's MoE block (stage_owns skips the
    other's experts)."""
    greedy = {"max_new_tokens": 12, "temperature": 0}
    r = requests.post(
        single.url + "/generate", json={"text": PROMPTS, "sampling_params": greedy}, timeout=120
    )
    assert r.status_code == 200, r.text
    want = [o["output_ids"] for o in r.json()]
    with Engine(tiny_moe_dir, **engine_args(pp_size=2)) as e:
        assert e.scheduler_info["pp_size"] == 2
        assert [o["output_ids"] for o in e.generate(PROMPTS, greedy)] == want
