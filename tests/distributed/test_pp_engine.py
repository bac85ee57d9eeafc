"""Pipeline-parallel engines end to end (gloo, one thread per rank): a 4-layer random Llama with an
untied LM head at PP=2 (an uneven --pp-layer-partition) and PP=3 (the even split, 1,2,1) gives
PP=1's greedy outputs, streaming and not, from the radix cache, for a prompt that needs chunked
prefill, with a json_schema and for a concurrent batch of mixed lengths (mixed chunks on; decode
steps as micro-batches following each other through the stages, at PP=3 of at most
--pp-max-micro-batch-size 2 requests, and each prefill chunk as pipelined pieces); each stage's KV
pool holds its layers only. Under a pool too small for every request, PP=2 retracts and still gives
HF's greedy outputs, and an aborted stream frees its KV. A pp size larger than the model's layers,
or a partition that does not add up, is refused before any process starts, naming both numbers."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
SHARED = "You are a helpful assistant. Answer briefly and precisely. " * 4
LONG = "Once upon a time, " * 30 + "the end. Summary:"  # ~150 tokens: 5 chunks of 32
PROMPTS = [
    SHARED + "What is the capital of France?",
    SHARED + "Name three primes.",
    LONG,
    "def fib(n):",
]
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
MIXED = [
    ("Count: one, two,", 3),
    (LONG + " again", 20),
    ("Hello", 9),
    (SHARED + "Why?", 14),
    ("1 2 3", 1),
]
OPTIONS = dict(chunked_prefill_size=32, enable_mixed_chunk=True, max_total_tokens=4000)


@pytest.fixture(scope="module")
def tiny4_model_dir(tmp_path_factory, default_model_path):
    """A 4-layer Llama whose LM head is its own matrix (the last stage holds it, not the
    embedding)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from radixlm.model.loader import load_tokenizer

    path = tmp_path_factory.mktemp("tiny4-llama")
    tok = load_tokenizer(default_model_path)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.25,
    )
    torch.manual_seed(1)
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _run(model: str, pp: int, **options) -> dict:
    kw = engine_args(**OPTIONS, **options)
    if pp > 1:
        kw["pp_size"] = pp
    with Engine(model, **kw) as e:
        assert e.scheduler_info["pp_size"] == pp
        out: dict = {
            "kv_bytes": e.scheduler_info["kv_cache_bytes"],
            "tokens": e.scheduler_info["max_total_num_tokens"],
        }
        out["plain"] = [o["output_ids"] for o in e.generate(PROMPTS, GREEDY)]
        out["again"] = [
            o["output_ids"] for o in e.generate(PROMPTS, GREEDY)
        ]  # now from the radix cache
        out["stream"] = [c["output_ids"] for c in e.generate(LONG, GREEDY, stream=True)][-1]
        sp = dict(GREEDY, max_new_tokens=48, ignore_eos=False, json_schema=json.dumps(SCHEMA))
        out["json"] = e.generate("Describe a person as JSON:", sp)["text"]
        with ThreadPoolExecutor(
            len(MIXED)
        ) as pool:  # arriving at different steps: prefills beside decodes
            out["mixed"] = list(
                pool.map(
                    lambda pn: e.generate(pn[0], dict(GREEDY, max_new_tokens=pn[1]))["output_ids"],
                    MIXED,
                )
            )
        state = e.get_internal_state()
        out["parts"] = state.get("pp_micro_batches"), state.get("pp_prefill_pieces")
    return out


@pytest.fixture(scope="module")
def pp1(tiny4_model_dir) -> dict:
    return _run(tiny4_model_dir, 1)


@pytest.mark.parametrize(
    "pp, options, first_stage_layers",
    [(2, {"pp_layer_partition": "3,1"}, 3), (3, {"pp_max_micro_batch_size": 2}, 1)],
)
def test_pp_matches_pp1(pp, options, first_stage_layers, pp1, tiny4_model_dir):
    got = _run(tiny4_model_dir, pp, **options)
    # decode steps of several requests ran as micro-batches, prefill chunks as pieces, through the
    # stages
    assert pp1["parts"] == (None, None) and min(got["parts"]) > 0, got["parts"]
    assert pp1["again"] == pp1["plain"]
    for key in ("plain", "again", "stream", "json", "mixed"):
        assert got[key] == pp1[key], key
    assert got["stream"] == pp1["plain"][2]
    jsonschema.validate(json.loads(got["json"]), SCHEMA)
    # Stage 0 (whose info the engine reports) keeps KV for its layers only, for as many slots.
    assert got["tokens"] == pp1["tokens"]
    assert got["kv_bytes"] * 4 == pp1["kv_bytes"] * first_stage_layers


def test_pp_larger_than_layers_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="pp_size 3 is larger than the model's 2 layers"):
        Engine(tiny_model_dir, **engine_args(pp_size=3))
    with pytest.raises(
        ValueError,
        match="pp_layer_partition 1,2 must have pp_size 2 entries summing to the model's 2 layers",
    ):
        Engine(tiny_model_dir, **engine_args(pp_size=2, pp_layer_partition="1,2"))
    with pytest.raises(ValueError, match="pp_layer_partition must be layers per stage"):
        Engine(tiny_model_dir, **engine_args(pp_size=2, pp_layer_partition="1;1"))
    with pytest.raises(ValueError, match="pp_max_micro_batch_size must be >= 1, got 0"):
        Engine(tiny_model_dir, **engine_args(pp_size=2, pp_max_micro_batch_size=0))


def test_default_model_pp2_matches_pp1(default_model_path):
    """The default model (30 layers, tied embeddings) in float32: stage 1 reads the embedding matrix
    as its LM head."""
    sp = dict(GREEDY, max_new_tokens=12)
    prompts = PROMPTS[:2] + ["def fib(n):"]
    outs = []
    for pp in (1, 2):
        kw = engine_args(
            quantization="none", chunked_prefill_size=32, **({"pp_size": 2} if pp > 1 else {})
        )
        with Engine(default_model_path, **kw) as e:
            outs.append([o["output_ids"] for o in e.generate(prompts, sp)])
    assert outs[1] == outs[0]


def test_pp2_retraction_and_abort_match_hf(tiny_model_dir, tiny_hf_model):
    """A pool too small for every request at once: requests are retracted and come back, each with
    HF's greedy output; an aborted stream ends as aborted and frees its KV on every stage."""
    from tests.scheduler.harness import hf_greedy

    rng = random.Random(7)
    prompts = [[rng.randrange(3, 40000) for _ in range(30)] for _ in range(8)]
    sp = {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True}
    with Engine(tiny_model_dir, **engine_args(pp_size=2, max_total_tokens=400)) as e:
        outs = e.generate(input_ids=prompts, sampling_params=sp)
        assert e.get_internal_state()["num_retracted"] > 0, (
            "the pool was meant to be too small for all requests"
        )
        stream = e.generate(
            "Go on:",
            {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True},
            stream=True,
            rid="long",
        )
        next(stream)
        e.abort_request("long")
        last = list(stream)[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(last["output_ids"]) < 300
        state = e.get_internal_state()
        assert (
            state["available_kv_tokens"] + state["evictable_tokens"]
            == state["max_total_num_tokens"]
        )
    assert [o["output_ids"] for o in outs] == [hf_greedy(tiny_hf_model, p, 60) for p in prompts]
