"""Speculative decoding and jump-forward together: a verify step must not run past the point where
the grammar forces text. Decoding jumps forward there (the forced text's canonical tokens), while
the verify step would take the model's own tokens for it, one by one (e.g. '"' ',' where the jump
gives '",'), so the greedy output differed from plain decoding once a draft crossed a forced
stretch (found by the soak, docs/reliability.md)."""

import json

import pytest

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
)
PROMPTS = [
    (
        "Was are part also such early red but have in library. Field quiet station state these"
        " through was heavy. Which about into some long for year singer.\n\nIs the river long?"
        " (request 85)\n"
    ),
    "Name a person and their age.\n",
    "Library bridge winter. Who is the teacher?\n",
]
SP = {"max_new_tokens": 24, "temperature": 0, "json_schema": SCHEMA}


def outputs(engine, stream: bool) -> list:
    out = []
    for p in PROMPTS:
        if stream:
            *_, last = engine.generate(p, sampling_params=SP, stream=True)
        else:
            last = engine.generate(p, sampling_params=SP)
        out.append((last["output_ids"], last["text"], last["meta_info"]["finish_reason"]))
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_drafts_stop_where_grammar_forces_text(tiny_engine, radix_engine, stream):
    """Plain decoding's answers (tests/conftest.py's shared engines, their caches flushed)."""
    pytest.importorskip("xgrammar")
    plain = outputs(tiny_engine, stream)
    e = radix_engine
    accepted = e.get_internal_state()["spec_accepted_tokens"]
    first = outputs(e, stream)
    # The second pass drafts the first's answers from the radix tree, across the forced
    # stretches.
    second = outputs(e, stream)
    assert e.get_internal_state()["spec_accepted_tokens"] > accepted
    assert first == plain
    assert second == plain
