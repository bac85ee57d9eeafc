"""Benchmark workloads as token-id prompts (no tokenizer round trip, exact lengths)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class BenchRequest:
    input_ids: list[int]
    output_len: int
    group: int = 0


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    # Skip the low ids, which are special tokens in most vocabularies.
    return [rng.randrange(256, vocab) for _ in range(n)]


def generated_shared_prefix(
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    vocab_size: int,
    seed: int = 0,
    shuffle: bool = False,
) -> list[BenchRequest]:
    """SGLang's gsp: groups of prompts that share a long system prompt, each with its own question.
    Returned interleaved across groups (the arrival order that makes caching hard), or in a random
    order (shuffle: many clients at once; a round-robin over replicas then sends every group
    everywhere, where the interleaved order would hand each replica fixed groups by accident)."""
    rng = random.Random(seed)
    systems = [_tokens(rng, system_prompt_len, vocab_size) for _ in range(num_groups)]
    reqs = [
        BenchRequest(systems[g] + _tokens(rng, question_len, vocab_size), output_len, g)
        for _ in range(prompts_per_group)
        for g in range(num_groups)
    ]
    if shuffle:
        rng.shuffle(reqs)
    return reqs


def random_prompts(
    num: int,
    input_len: int,
    output_len: int,
    vocab_size: int,
    range_ratio: float = 1.0,
    seed: int = 0,
):
    rng = random.Random(seed)
    out = []
    for _ in range(num):
        n = rng.randint(max(1, int(input_len * range_ratio)), input_len)
        m = rng.randint(max(1, int(output_len * range_ratio)), output_len)
        out.append(BenchRequest(_tokens(rng, n, vocab_size), m))
    return out


# A schema-heavy JSON workload: many fixed keys, so the grammar forces long runs of text.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "first_name": {"type": "string", "maxLength": 16},
        "last_name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "is_employed": {"type": "boolean"},
        "favorite_color": {"enum": ["red", "green", "blue"]},
        "home_city": {"type": "string", "maxLength": 16},
        "number_of_children": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": [
        "first_name",
        "last_name",
        "age",
        "is_employed",
        "favorite_color",
        "home_city",
        "number_of_children",
    ],
}


def json_person_prompts(num: int) -> list[str]:
    return [
        f"Invent a fictional person (number {i}) and describe them as a JSON object."
        for i in range(num)
    ]
