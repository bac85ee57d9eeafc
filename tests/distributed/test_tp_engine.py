"""Tensor-parallel engines end to end (gloo, one thread per rank): the tiny Llama (4 heads / 2 KV
heads) at TP=2 and the default model (9 heads / 3 KV heads) at TP=3, in float32, give TP=1's greedy
outputs with the radix cache, chunked prefill, mixed chunks and structured output, and with
speculative decoding over the hierarchical cache (KV evicted to L2 and loaded back); every step's
state digest is compared across the ranks (--enable-invariant-checks). A TP size that does not
divide the heads is a start-up error naming both numbers."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixlm import Engine
from tests.conftest import engine_args

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
SHARED = "You are a helpful assistant. Answer briefly and precisely. " * 6
PROMPTS = [
    SHARED + "What is the capital of France?",
    SHARED + "Name three primes.",
    "Once upon a time, " * 40 + "the end. Summary:",
    "def fib(n):",
]
GREEDY = {"max_new_tokens": 24, "temperature": 0}
# One engine per TP size with every option on (each run at TP 3 on two cores costs ~45 s): chunked
# prefill and mixed chunks, speculative decoding over the hierarchical cache (KV evicted to L2 and
# loaded back), structured output.
OPTIONS = dict(
    chunked_prefill_size=64,
    enable_mixed_chunk=True,
    speculative_algorithm="ngram",
    speculative_draft_policy="fixed",
    speculative_num_draft_tokens=4,
    enable_hierarchical_cache=True,
    max_total_tokens=700,
    disable_jump_forward=True,
)


def _run(tp: int, model_path: str) -> dict:
    kw = engine_args(quantization="none", **OPTIONS)
    if tp > 1:
        kw["tp_size"] = tp
    with Engine(model_path, **kw) as e:
        assert e.scheduler_info["tp_size"] == tp
        out = {"plain": [o["output_ids"] for o in e.generate(PROMPTS, GREEDY)]}
        # again: now from the radix cache (or, under memory pressure, L2)
        out["again"] = [o["output_ids"] for o in e.generate(PROMPTS, GREEDY)]
        sp = dict(GREEDY, max_new_tokens=64, json_schema=json.dumps(SCHEMA))  # long integers
        out["json"] = e.generate("Describe a person as JSON:", sp)["text"]
    return out


@pytest.mark.parametrize("model,tp", [("tiny", 2), ("default", 3)])
def test_tp_matches_tp1(model, tp, request):
    path = request.getfixturevalue("tiny_model_dir" if model == "tiny" else "default_model_path")
    ref = _run(1, path)
    got = _run(tp, path)
    assert got["plain"] == ref["plain"]
    assert got["again"] == ref["again"] == ref["plain"]
    assert got["json"] == ref["json"]
    jsonschema.validate(json.loads(got["json"]), SCHEMA)


def test_heads_not_divisible_is_a_start_up_error(default_model_path):
    with pytest.raises(RuntimeError, match="num_attention_heads 9 is not divisible by tp_size 2"):
        Engine(default_model_path, **engine_args(tp_size=2))
