"""The soak's seeded request mix: every API and mode, constraints, logprobs, n > 1, short prompts
and long ones sharing prefixes of a few documents, planned disconnects; then fitted to the server's
context.
"""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

from radixlm.bench.soak.config import SoakConfig

# Prompts are built of these words (about a token each).
_WORDS = (
    "the of and to in is was for on that with as by at from his her their it an be this which or"
    " have had not are were but one all new more some time about can only other into year after"
    " first would two these over most city also many people may made such world where state during"
    " between through part three under house later while school since water music group early river"
    " family north south east west small large number known name order light garden market field"
    " story paper window table morning evening winter summer island bridge station village mountain"
    " forest valley letter road travel train engine library museum teacher student doctor farmer"
    " builder painter singer writer red green blue yellow black white quiet bright old young long"
    " short warm cold heavy simple clear"
).split()

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
            "confidence": {"type": "number"},
        },
        "required": ["answer"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 1,
        "maxItems": 4,
    },
]
REGEXES = [
    r"(yes|no|maybe), because [a-z]{1,10}( [a-z]{1,10}){0,3}\.",
    r"[0-9]{1,4}(\.[0-9]{1,2})?",
    r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
]
QUESTIONS = [
    "What is the main idea?",
    "Summarize this in one sentence.",
    "Who is the teacher?",
    "Name a city.",
    "Is the river long?",
    "Write a short poem about winter.",
    "What happened in the morning?",
    "List three colors.",
    "Describe the old bridge.",
    "Why was the station quiet?",
]
APIS = ("native", "completions", "chat")
PATHS = {"native": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclasses.dataclass
class SoakRequest:
    idx: int
    api: str
    stream: bool
    n: int
    greedy: bool
    constraint: str | None  # None, "json" or "regex"
    constraint_value: Any  # the schema (dict) or the regex
    logprobs: bool
    top_logprobs: int
    long: bool
    max_new_tokens: int
    # None; "now" (within 0.2 s: before the answer's first byte), "timer" (at a random moment:
    # disconnect_after is the fraction of the delay range) or "events" (after that many stream
    # events)
    disconnect: str | None
    disconnect_after: float
    body: dict
    est_prompt_tokens: int = 0

    @property
    def kind(self) -> str:
        return f"{self.api}/{'stream' if self.stream else 'plain'}"

    @property
    def path(self) -> str:
        return PATHS[self.api]

    def features(self) -> list[str]:
        f = [self.kind, "long" if self.long else "short", "greedy" if self.greedy else "sampled"]
        if self.n > 1:
            f.append("n>1")
        if self.constraint:
            f.append(self.constraint)
        if self.logprobs:
            f.append("logprobs")
        return f


def _doc(rng: random.Random, words: int) -> list[str]:
    out = []
    while len(out) < words:
        s = [rng.choice(_WORDS) for _ in range(rng.randint(6, 16))]
        s[0] = s[0].capitalize()
        s[-1] += "."
        out.extend(s)
    return out[:words]


def build_workload(cfg: SoakConfig) -> list[SoakRequest]:
    """The seeded request mix (bodies included); prompt sizes are in words, about a token each."""
    rng = random.Random(cfg.seed)
    docs = [_doc(rng, cfg.long_words[1]) for _ in range(cfg.num_docs)]
    reqs = []
    for i in range(cfg.num_requests):
        api = rng.choice(APIS)
        stream = rng.random() < cfg.stream_fraction
        n = rng.randint(2, 3) if rng.random() < cfg.n_fraction else 1
        greedy = rng.random() < cfg.greedy_fraction
        r = rng.random()
        constraint = (
            "json"
            if r < cfg.json_fraction
            else "regex"
            if r < cfg.json_fraction + cfg.regex_fraction
            else None
        )
        cval = (
            rng.choice(SCHEMAS)
            if constraint == "json"
            else rng.choice(REGEXES)
            if constraint == "regex"
            else None
        )
        logprobs = rng.random() < cfg.logprob_fraction
        top = rng.choice([0, 1, 3, 5]) if logprobs else 0
        long = rng.random() < cfg.long_fraction
        mnt = rng.randint(*cfg.max_new_tokens)
        question = f"{rng.choice(QUESTIONS)} (request {i})"
        if long:
            doc = " ".join(docs[rng.randrange(cfg.num_docs)][: rng.randint(*cfg.long_words)])
            context = doc
        else:
            context = " ".join(_doc(rng, rng.randint(*cfg.short_words)))
        disconnect, after = None, 0.0
        if rng.random() < cfg.disconnect_rate:
            if stream and rng.random() < 0.5:
                disconnect, after = "events", float(rng.randint(1, max(1, mnt // 2)))
            else:
                # A third right away (before the first byte of the answer), the rest at any moment.
                disconnect = "now" if rng.random() < 0.33 else "timer"
                after = rng.random()
        temp = (
            {"temperature": 0.0}
            if greedy
            else {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(2**31)}
        )
        if api == "native":
            sp: dict[str, Any] = {"max_new_tokens": mnt, "n": n, **temp}
            if constraint == "json":
                sp["json_schema"] = json.dumps(cval)
            elif constraint == "regex":
                sp["regex"] = cval
            body: dict[str, Any] = {
                "text": f"{context}\n\n{question}\n",
                "sampling_params": sp,
                "stream": stream,
            }
            if logprobs:
                body.update(return_logprob=True, top_logprobs_num=top)
        else:
            body = {"max_tokens": mnt, "n": n, "stream": stream, **temp}
            if stream and rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
            if api == "completions":
                body["prompt"] = f"{context}\n\n{question}\n"
                if constraint == "json":
                    # a string: SGLang's type for the field, the gateway's too (radixlm takes both)
                    body["json_schema"] = json.dumps(cval)
                elif constraint == "regex":
                    body["regex"] = cval
                if logprobs:
                    body["logprobs"] = top
            else:
                msgs = [{"role": "user", "content": question}]
                if long or rng.random() < 0.5:
                    msgs.insert(0, {"role": "system", "content": context})
                body["messages"] = msgs
                if constraint == "json":
                    body["response_format"] = {
                        "type": "json_schema",
                        "json_schema": {"name": "answer", "schema": cval},
                    }
                elif constraint == "regex":
                    body["regex"] = cval
                if logprobs:
                    body.update(logprobs=True, top_logprobs=top)
        reqs.append(
            SoakRequest(
                i,
                api,
                stream,
                n,
                greedy,
                constraint,
                cval,
                logprobs,
                top,
                long,
                mnt,
                disconnect,
                after,
                body,
            )
        )
    return reqs


def _prompt_text(req: SoakRequest) -> str:
    b = req.body
    return b.get("text") or b.get("prompt") or "\n".join(m["content"] for m in b["messages"])


TOKENIZE_BATCH = 256  # prompts per /tokenize call
CHAT_TEMPLATE_TOKENS = (
    48  # a margin for the chat template's own tokens (roles, default system prompt)
)


async def fit_workload(client, url: str, reqs: list[SoakRequest], context_len: int) -> None:
    """Count each prompt's tokens (the server's /tokenize) and trim max_new_tokens so that every
    request fits the context (prompt + max_new_tokens < context); name the served model in the
    OpenAI requests, as OpenAI's clients do (SGLang's gateway refuses a completion without one)."""
    model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
    for q in reqs:
        if q.api != "native":
            q.body["model"] = model
    counts = []
    for i in range(0, len(reqs), TOKENIZE_BATCH):  # within the server's --max-client-batch-size
        r = await client.post(
            url + "/tokenize",
            json={"text": [_prompt_text(q) for q in reqs[i : i + TOKENIZE_BATCH]]},
        )
        r.raise_for_status()
        counts += r.json()["count"]
    if len(counts) != len(reqs):
        raise ValueError(f"/tokenize counted {len(counts)} prompts of {len(reqs)}")
    for q, count in zip(reqs, counts):
        q.est_prompt_tokens = count + (CHAT_TEMPLATE_TOKENS if q.api == "chat" else 0)
        room = context_len - q.est_prompt_tokens - 8
        if room < 1:
            raise ValueError(
                f"request {q.idx}'s prompt ({q.est_prompt_tokens} tokens) does not fit the context "
                f"{context_len}: lower the long prompt sizes"
            )
        if q.max_new_tokens > room:
            q.max_new_tokens = room
            if q.api == "native":
                q.body["sampling_params"]["max_new_tokens"] = room
            else:
                q.body["max_tokens"] = room


def offered_load(reqs: list[SoakRequest], concurrency: int) -> float:
    """KV tokens `concurrency` average requests would hold at once: prompt + n * max_new_tokens
    each."""
    per = [q.est_prompt_tokens + q.n * q.max_new_tokens for q in reqs]
    return concurrency * sum(per) / max(len(per), 1)
