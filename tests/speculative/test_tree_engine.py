"""Tree drafts from the radix cache through the engine, on the default model (SmolLM2 GGUF on the
native kernels): after sampled answers put several recorded continuations under each prompt, the
greedy requests draft trees of them, and their outputs equal plain decoding's token for token, free,
under a JSON schema and streamed, in mixed batches (chunked prefill mixed with decode steps), with
the KV ownership invariants checked after every step."""

from __future__ import annotations

import json
import threading

import jsonschema
import pytest

from radixlm import Engine
from tests.conftest import engine_args

pytest.importorskip("xgrammar")

PROMPTS = [
    "Fruits: apple, banana, cherry, date, elderberry, fig, grape.\nThe same fruits again: apple,",
    "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n",
    "Once upon a time",
]
SCHEMA = {
    "type": "object",
    "properties": {"fruits": {"type": "array", "items": {"type": "string"}, "maxItems": 6}},
    "required": ["fruits"],
}
GREEDY = {"max_new_tokens": 24, "temperature": 0}
JSON = {"max_new_tokens": 32, "temperature": 0, "json_schema": json.dumps(SCHEMA)}


def run(engine: Engine) -> tuple[list, list, list]:
    """Each prompt greedy, then three sampled answers of each (temperature 0.6: they follow the
    greedy answer for a while and leave it at different depths; recorded after it, they rank first
    where they branch off, so the greedy path goes through second children); then the measured
    mixed batch (greedy, JSON, a sampled one) beside a streamed greedy request."""
    engine.generate(PROMPTS + [PROMPTS[0]], [GREEDY] * len(PROMPTS) + [JSON])
    sampled = [{**GREEDY, "temperature": 0.6, "seed": s} for s in range(3)]
    engine.generate(
        PROMPTS * 3 + [PROMPTS[0]],
        [sp for sp in sampled for _ in PROMPTS] + [{**JSON, "temperature": 0.6, "seed": 9}],
    )
    streamed: list = []
    t = threading.Thread(
        target=lambda: streamed.extend(engine.generate(PROMPTS[1], GREEDY, stream=True))
    )
    t.start()
    outs = engine.generate(
        PROMPTS + [PROMPTS[0], PROMPTS[2]],
        [GREEDY] * len(PROMPTS) + [JSON, {**GREEDY, "temperature": 0.8, "seed": 5}],
    )
    t.join()
    return [o["output_ids"] for o in outs[:-1]], outs, streamed


def test_radix_tree_drafts_equal_plain_decoding(default_model_path):
    res = {}
    for spec in (None, "radix"):
        kw = (
            dict(
                speculative_algorithm="radix",
                speculative_draft_policy="fixed",
                speculative_eagle_topk=4,
            )
            if spec
            else {}
        )
        with Engine(
            default_model_path,
            **engine_args(num_threads=2, enable_mixed_chunk=True, chunked_prefill_size=64, **kw),
        ) as e:
            res[spec] = run(e)
            if spec:
                st = e.get_internal_state()
    (greedy, outs, streamed), (greedy_ref, _, streamed_ref) = res["radix"], res[None]
    # The native kernel gives a tree node bitwise its decode step's result: no near-tie to allow.
    assert greedy == greedy_ref
    assert streamed[-1]["output_ids"] == streamed_ref[-1]["output_ids"]
    jsonschema.validate(json.loads(outs[len(PROMPTS)]["text"]), SCHEMA)
    # Trees were drafted, and greedy paths went through branches other than the first.
    assert st["spec_tree_drafts"] > 0 and st["spec_branch_accepted"] > 0, st
    assert sum(o["meta_info"]["spec_accepted_tokens"] for o in outs) > 0
