"""Workloads of `radixlm bench serving` as text (any server takes text).

The shapes come from bench/workloads.py (token-id prompts); each id is then written as a
word that is one token of the model's vocabulary (" house", " river", ...), so a prompt of
n ids is a text of n tokens, to the token, with the same tokenizer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from radixlm.bench.serving_client import RequestInput
from radixlm.bench.workloads import (
    PERSON_SCHEMA,
    generated_shared_prefix,
    json_person_prompts,
    random_prompts,
)

DATASETS = ("random", "gsp", "multi-turn", "fork", "json", "grounded", "recurring")


class WordVocab:
    """The single-token words of a tokenizer: ' ' + 2 to 12 ASCII letters, each encoding to one
    id."""

    def __init__(self, tokenizer):
        size = len(tokenizer)
        decoded = tokenizer.batch_decode([[i] for i in range(size)])
        cands = [
            s
            for s in decoded
            if s[:1] == " " and 3 <= len(s) <= 13 and s[1:].isascii() and s[1:].isalpha()
        ]
        ids = tokenizer(cands, add_special_tokens=False)["input_ids"]
        one = {w: t[0] for w, t in zip(cands, ids) if len(t) == 1}
        self.words = sorted(one)
        self._ids = [one[w] for w in self.words]
        if len(self.words) < 100:
            raise ValueError(
                f"the tokenizer has only {len(self.words)} single-token words; cannot build prompts"
            )
        self.vocab_size = size

    def text(self, ids: list[int]) -> str:
        return "".join(self.words[i % len(self.words)] for i in ids)

    def token_ids(self, ids: list[int]) -> list[int]:
        """The token ids of text(ids), word by word."""
        return [self._ids[i % len(self._ids)] for i in ids]

    def random_text(self, rng: random.Random, n: int) -> str:
        return "".join(rng.choice(self.words) for _ in range(n))


@dataclass
class Session:
    """What one arrival brings: turns run one after the other, the requests of a turn at once.
    When chained, a turn continues the conversation: its prompt is the history so far (all
    previous messages and answers) followed by its own messages."""

    turns: list[list[RequestInput]]
    chained: bool = False

    @property
    def num_requests(self) -> int:
        return sum(len(t) for t in self.turns)


def _single(req: RequestInput) -> Session:
    return Session([[req]])


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def build_sessions(args, words: WordVocab) -> list[Session]:
    vocab, seed = words.vocab_size, args.seed
    if args.dataset == "random":
        reqs = random_prompts(
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            vocab,
            args.random_range_ratio,
            seed,
        )
        return [_single(RequestInput(_user(words.text(r.input_ids)), r.output_len)) for r in reqs]
    if args.dataset in ("gsp", "fork"):
        if args.dataset == "gsp":
            shape = (
                args.gsp_num_groups,
                args.gsp_prompts_per_group,
                args.gsp_system_prompt_len,
                args.gsp_question_len,
                args.gsp_output_len,
            )
        else:
            shape = (
                args.num_prompts,
                args.fork_n,
                args.fork_prefix_len,
                args.fork_branch_len,
                args.fork_output_len,
            )
        prefix_len = shape[2]
        reqs = generated_shared_prefix(
            *shape, vocab, seed, shuffle=args.dataset == "gsp" and args.gsp_order == "shuffled"
        )
        inputs = [
            RequestInput(
                [
                    {"role": "system", "content": words.text(r.input_ids[:prefix_len])},
                    {"role": "user", "content": words.text(r.input_ids[prefix_len:])},
                ],
                r.output_len,
            )
            for r in reqs
        ]
        if args.dataset == "gsp":  # independent requests, arriving interleaved across groups
            return [_single(r) for r in inputs]
        branches: dict[int, list[RequestInput]] = {}
        for r, inp in zip(reqs, inputs):
            branches.setdefault(r.group, []).append(inp)
        return [
            Session([b]) for _, b in sorted(branches.items())
        ]  # the n branches of a fork at once
    if args.dataset == "multi-turn":
        return _multi_turn(args, words)
    if args.dataset == "json":
        schema = json.dumps(PERSON_SCHEMA)
        return [
            # No ignore_eos: the output ends where the JSON object does.
            _single(
                RequestInput(
                    _user(f"{q} Reply with JSON that follows this schema: {schema}\n"),
                    args.json_output_len,
                    ignore_eos=False,
                    json_schema=PERSON_SCHEMA,
                )
            )
            for q in json_person_prompts(args.num_prompts)
        ]
    if args.dataset == "grounded":
        from radixlm.bench.spec_datasets import grounded_requests

        return [
            _single(r)
            for r in grounded_requests(
                args.num_prompts, args.grounded_sentences, args.grounded_output_len, seed
            )
        ]
    if args.dataset == "recurring":
        from radixlm.bench.spec_datasets import recurring_requests

        return [
            _single(r)
            for r in recurring_requests(
                args.recurring_num_prompts, args.recurring_repeats, args.recurring_output_len, seed
            )
        ]
    raise ValueError(f"unknown dataset {args.dataset!r}; one of {', '.join(DATASETS)}")


def _multi_turn(args, words: WordVocab) -> list[Session]:
    """Conversations of --num-turns turns, each turn's prompt the history + a new question, all
    starting with one shared system prompt of --multi-turn-system-len tokens (0: none). With
    --multi-turn-token-ids the history is token ids (previous prompt + the ids the server
    answered): a real model's answer re-tokenizes to its own tokens, a random model's does not."""
    n, turns, seed = args.num_conversations, args.num_turns, args.seed
    token_ids = getattr(args, "multi_turn_token_ids", False)
    if token_ids and args.backend not in ("radixlm", "llama-cpp"):
        raise ValueError("--multi-turn-token-ids: needs --backend radixlm or llama-cpp")
    reqs = random_prompts(
        n * turns,
        args.multi_turn_question_len,
        args.multi_turn_output_len,
        words.vocab_size,
        1.0,
        seed,
    )
    system_len = getattr(args, "multi_turn_system_len", 0)
    system = (
        random_prompts(1, system_len, 1, words.vocab_size, 1.0, seed + 1)[0].input_ids
        if system_len
        else []
    )
    inputs = []
    for i, r in enumerate(reqs):
        raw = (system if i % turns == 0 else []) + r.input_ids
        ids = words.token_ids(raw) if token_ids else None
        inputs.append(RequestInput(_user(words.text(raw)), r.output_len, input_ids=ids))
    return [
        Session([[r] for r in inputs[c * turns : (c + 1) * turns]], chained=True) for c in range(n)
    ]


def warmup_request(words: WordVocab, seed: int) -> RequestInput:
    """A short prompt unrelated to the workload (its KV shares no prefix with it)."""
    return RequestInput(
        _user("Warm up:" + words.random_text(random.Random(seed + 1_000_003), 8)), 4
    )


def json_valid(text: str, schema: dict) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:  # not installed: the required keys at least
        return isinstance(doc, dict) and all(k in doc for k in schema.get("required", []))
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return False
    return True
