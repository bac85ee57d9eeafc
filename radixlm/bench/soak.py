"""Soak: many mixed requests against a KV pool far too small for the offered load, with clients
disconnecting at random moments; then checks that nothing failed, hung, died or leaked, and that
greedy outputs equal a quiet run's (docs/reliability.md, "Soak").

    python benchmarks/soak.py --server-args "--max-total-tokens 3000 --enable-invariant-checks"
    python benchmarks/soak.py --url http://127.0.0.1:30000

The workload is a seeded mix of: the native API (/generate) and the OpenAI API (/v1/completions,
/v1/chat/completions), streaming and not, n > 1, JSON schema and regex constraints, logprobs with
top logprobs, greedy and seeded sampling, short prompts and long ones (built on a few shared
documents, so that prompts share prefixes of many lengths). A share of the clients disconnect:
after a random delay (before the answer's first byte, or mid-stream) or after a random number of
stream events. `concurrency` clients send the requests back to back.

Checks (each printed; any failure makes main() return 1):
- status: every request answered 200 (or 429 when the server runs with --max-queued-requests);
  no 5xx, no other 4xx, no error event inside a stream, no dropped connection
- bound: every request ended (or was disconnected) within --request-timeout seconds
- outputs: every answered request has its n choices, none aborted by the server, constrained outputs
  that stopped match their schema / regex, logprobs are there (one per output token, top-k each
  on the native API), the n choices of a greedy request are equal
- alive: the server answers /health 200 (and, when this script started it, its process runs)
- leaks: once the load is over, nothing is tracked, running or waiting, every request slot is free,
  no radix node is locked and free + evictable KV == the pool; /flush_cache then frees it all
- greedy: every greedy (temperature 0) request that was not disconnected, sent again alone after
  the load, gives the same output (token ids on the native API, text on the OpenAI API)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import re
import shlex
import statistics
import sys
import time
from collections import Counter
from typing import Any, Optional

# ----------------------------------------------------------------------------- workload
_WORDS = (
    "the of and to in is was for on that with as by at from his her their it an be this which or have "
    "had not are were but one all new more some time about can only other into year after first would "
    "two these over most city also many people may made such world where state during between through "
    "part three under house later while school since water music group early river family north south "
    "east west small large number known name order light garden market field story paper window table "
    "morning evening winter summer island bridge station village mountain forest valley letter road "
    "travel train engine library museum teacher student doctor farmer builder painter singer writer "
    "red green blue yellow black white quiet bright old young long short warm cold heavy simple clear"
).split()

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
                                      "confidence": {"type": "number"}},
     "required": ["answer"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 4},
]
REGEXES = [
    r"(yes|no|maybe), because [a-z]{1,10}( [a-z]{1,10}){0,3}\.",
    r"[0-9]{1,4}(\.[0-9]{1,2})?",
    r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
]
QUESTIONS = [
    "What is the main idea?", "Summarize this in one sentence.", "Who is the teacher?", "Name a city.",
    "Is the river long?", "Write a short poem about winter.", "What happened in the morning?",
    "List three colors.", "Describe the old bridge.", "Why was the station quiet?",
]
APIS = ("native", "completions", "chat")
PATHS = {"native": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclasses.dataclass
class SoakConfig:
    num_requests: int = 1000
    concurrency: int = 64
    seed: int = 0
    disconnect_rate: float = 0.2
    # Timed disconnects happen within this many seconds; None: within 1.5x the median latency of the
    # requests answered so far (8 s until 5 are), so that they hit queued, prefilling and decoding
    # requests alike however loaded the server is.
    disconnect_max_delay: Optional[float] = None
    request_timeout: float = 600.0  # the hang bound: a request not over by then is a hang
    max_new_tokens: tuple[int, int] = (8, 64)
    short_words: tuple[int, int] = (3, 40)
    long_words: tuple[int, int] = (300, 2000)
    long_fraction: float = 0.3
    num_docs: int = 4
    greedy_fraction: float = 0.55
    stream_fraction: float = 0.5
    n_fraction: float = 0.12  # n in 2..3
    json_fraction: float = 0.1
    regex_fraction: float = 0.1
    logprob_fraction: float = 0.2
    drain_timeout: float = 60.0  # seconds to wait after the load for aborts to drain
    replay: bool = True  # the quiet replay of greedy requests
    allowed_statuses: tuple[int, ...] = (200, 429)


@dataclasses.dataclass
class SoakRequest:
    idx: int
    api: str
    stream: bool
    n: int
    greedy: bool
    constraint: Optional[str]  # None, "json" or "regex"
    constraint_value: Any  # the schema (dict) or the regex
    logprobs: bool
    top_logprobs: int
    long: bool
    max_new_tokens: int
    # None; "now" (within 0.2 s: before the answer's first byte), "timer" (at a random moment:
    # disconnect_after is the fraction of the delay range) or "events" (after that many stream events)
    disconnect: Optional[str]
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
        constraint = ("json" if r < cfg.json_fraction else
                      "regex" if r < cfg.json_fraction + cfg.regex_fraction else None)
        cval = rng.choice(SCHEMAS) if constraint == "json" else rng.choice(REGEXES) if constraint == "regex" else None
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
        temp = {"temperature": 0.0} if greedy else {"temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(2**31)}
        if api == "native":
            sp: dict[str, Any] = {"max_new_tokens": mnt, "n": n, **temp}
            if constraint == "json":
                sp["json_schema"] = json.dumps(cval)
            elif constraint == "regex":
                sp["regex"] = cval
            body: dict[str, Any] = {"text": f"{context}\n\n{question}\n", "sampling_params": sp, "stream": stream}
            if logprobs:
                body.update(return_logprob=True, top_logprobs_num=top)
        else:
            body = {"max_tokens": mnt, "n": n, "stream": stream, **temp}
            if stream and rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
            if api == "completions":
                body["prompt"] = f"{context}\n\n{question}\n"
                if constraint == "json":
                    body["json_schema"] = cval
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
                    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": cval}}
                elif constraint == "regex":
                    body["regex"] = cval
                if logprobs:
                    body.update(logprobs=True, top_logprobs=top)
        reqs.append(SoakRequest(i, api, stream, n, greedy, constraint, cval, logprobs, top, long, mnt, disconnect,
                                after, body))
    return reqs


def _prompt_text(req: SoakRequest) -> str:
    b = req.body
    return b.get("text") or b.get("prompt") or "\n".join(m["content"] for m in b["messages"])


CHAT_TEMPLATE_TOKENS = 48  # a margin for the chat template's own tokens (roles, default system prompt)


async def fit_workload(client, url: str, reqs: list[SoakRequest], context_len: int) -> None:
    """Count each prompt's tokens (the server's /tokenize) and trim max_new_tokens so that every
    request fits the context (prompt + max_new_tokens < context)."""
    r = await client.post(url + "/tokenize", json={"text": [_prompt_text(q) for q in reqs]})
    r.raise_for_status()
    counts = r.json()["count"]
    if len(counts) != len(reqs):
        raise ValueError(f"/tokenize counted {len(counts)} prompts of {len(reqs)}")
    for q, count in zip(reqs, counts):
        q.est_prompt_tokens = count + (CHAT_TEMPLATE_TOKENS if q.api == "chat" else 0)
        room = context_len - q.est_prompt_tokens - 8
        if room < 1:
            raise ValueError(f"request {q.idx}'s prompt ({q.est_prompt_tokens} tokens) does not fit the context "
                             f"{context_len}: lower the long prompt sizes")
        if q.max_new_tokens > room:
            q.max_new_tokens = room
            if q.api == "native":
                q.body["sampling_params"]["max_new_tokens"] = room
            else:
                q.body["max_tokens"] = room


def offered_load(reqs: list[SoakRequest], concurrency: int) -> float:
    """KV tokens `concurrency` average requests would hold at once: prompt + n * max_new_tokens each."""
    per = [q.est_prompt_tokens + q.n * q.max_new_tokens for q in reqs]
    return concurrency * sum(per) / max(len(per), 1)


# ----------------------------------------------------------------------------- client
@dataclasses.dataclass
class SoakResult:
    idx: int
    kind: str
    status: Any = None  # HTTP status, or "disconnected", "hang", "transport_error"
    http_status: Optional[int] = None
    latency: float = 0.0
    disconnected: bool = False
    disconnect_phase: Optional[str] = None  # before_response, before_first_event, mid_stream, body
    disconnect_delay: Optional[float] = None  # a timed disconnect's delay (s)
    stream_error: Optional[dict] = None
    error: Optional[str] = None
    events: int = 0
    choices: dict = dataclasses.field(default_factory=dict)  # index -> {"text", "ids", "finish", "lp", "top"}
    usage: Optional[dict] = None
    prompt_tokens: Optional[int] = None

    def outputs(self) -> list[dict]:
        """What the quiet run must reproduce: per choice its text, token ids (native) and finish reason."""
        return [{k: self.choices[i].get(k) for k in ("text", "ids", "finish")} for i in sorted(self.choices)]


class _Disconnect(Exception):
    pass


def _native_finish(fr) -> Optional[str]:
    return None if fr is None else fr.get("type")


class _Folder:
    """Folds responses (whole or streamed events) of one request into its SoakResult."""

    def __init__(self, req: SoakRequest, res: SoakResult, incremental: bool):
        self.req, self.res, self.incremental = req, res, incremental

    def choice(self, i: int) -> dict:
        return self.res.choices.setdefault(i, {"text": "", "ids": [] if self.req.api == "native" else None,
                                               "finish": None, "lp": None, "top": None})

    def native(self, out: dict, index: Optional[int] = None, delta: bool = False) -> None:
        c = self.choice(out.get("index", 0) if index is None else index)
        meta = out.get("meta_info", {})
        if delta:
            c["text"] += out.get("text", "")
            c["ids"] += out.get("output_ids", [])
        else:
            c["text"], c["ids"] = out.get("text", ""), list(out.get("output_ids", []))
        c["finish"] = _native_finish(meta.get("finish_reason"))
        if "output_token_logprobs" in meta:
            c["lp"] = len(meta["output_token_logprobs"])
        if "output_top_logprobs" in meta:
            c["top"] = [len(t) if t is not None else None for t in meta["output_top_logprobs"]]
        self.res.prompt_tokens = meta.get("prompt_tokens", self.res.prompt_tokens)

    def openai_choice(self, ch: dict, delta: bool) -> None:
        c = self.choice(ch.get("index", 0))
        if self.req.api == "chat":
            text = ((ch.get("delta") if delta else ch.get("message")) or {}).get("content") or ""
            lp = (ch.get("logprobs") or {}).get("content")
            n_lp = len(lp) if lp is not None else None
        else:
            text = ch.get("text") or ""
            lp = (ch.get("logprobs") or {}).get("tokens")
            n_lp = len(lp) if lp is not None else None
        c["text"] = c["text"] + text if delta else text
        if n_lp is not None:
            c["lp"] = (c["lp"] or 0) + n_lp if delta else n_lp
        if ch.get("finish_reason") is not None:
            c["finish"] = ch["finish_reason"]

    def whole(self, body: Any) -> None:
        if self.req.api == "native":
            for i, out in enumerate(body if isinstance(body, list) else [body]):
                self.native(out, index=i)
        else:
            for ch in body.get("choices", []):
                self.openai_choice(ch, delta=False)
            self.res.usage = body.get("usage")
            self.res.prompt_tokens = (self.res.usage or {}).get("prompt_tokens")

    def event(self, ev: dict) -> None:
        if self.req.api == "native":
            self.native(ev, delta=self.incremental)
        else:
            for ch in ev.get("choices", []):
                self.openai_choice(ch, delta=True)
            if ev.get("usage"):
                self.res.usage = ev["usage"]
                self.res.prompt_tokens = ev["usage"].get("prompt_tokens")


async def _send(client, url: str, req: SoakRequest, res: SoakResult, incremental: bool) -> None:
    fold = _Folder(req, res, incremental)
    res.disconnect_phase = "before_response"
    async with client.stream("POST", url + req.path, json=req.body) as resp:
        res.http_status = res.status = resp.status_code
        if resp.status_code != 200 or not req.stream:
            res.disconnect_phase = "body"
            raw = await resp.aread()
            try:
                body = json.loads(raw)
            except ValueError:
                res.error = raw[:300].decode(errors="replace")
                return
            if resp.status_code != 200:
                res.error = str((body.get("error") or {}).get("message") if isinstance(body, dict) else body)[:300]
                return
            fold.whole(body)
            return
        res.disconnect_phase = "before_first_event"
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                continue
            ev = json.loads(data)
            res.events += 1
            res.disconnect_phase = "mid_stream"
            if isinstance(ev, dict) and ev.get("error"):
                res.stream_error = ev["error"]
                res.status = ev["error"].get("code", "stream_error")
                res.error = str(ev["error"].get("message"))[:300]
                continue
            fold.event(ev)
            if req.disconnect == "events" and res.events >= req.disconnect_after:
                raise _Disconnect


async def run_request(client, url: str, req: SoakRequest, cfg: SoakConfig, incremental: bool,
                      disconnect: bool = True, max_delay: float = 8.0) -> SoakResult:
    """Send one request; never raises. disconnect=False: the quiet replay (no client disconnects).
    max_delay: the latest moment (s) of a timed disconnect."""
    import httpx

    res = SoakResult(req.idx, req.kind)
    t0 = time.perf_counter()

    async def go():
        try:
            if disconnect and req.disconnect in ("now", "timer"):
                lo, hi = (0.0, 0.2) if req.disconnect == "now" else (0.2, max(max_delay, 0.2))
                res.disconnect_delay = lo + req.disconnect_after * (hi - lo)
                await asyncio.wait_for(_send(client, url, req, res, incremental), res.disconnect_delay)
            else:
                await _send(client, url, req, res, incremental)
        except (_Disconnect, asyncio.TimeoutError):
            res.disconnected = True

    try:
        await asyncio.wait_for(go(), cfg.request_timeout)
    except asyncio.TimeoutError:
        res.status, res.error = "hang", f"not over after {cfg.request_timeout} s"
    except (httpx.HTTPError, ValueError) as e:  # a dropped connection, a broken stream
        res.status, res.error = "transport_error", f"{type(e).__name__}: {e}"[:300]
    res.latency = time.perf_counter() - t0
    if res.disconnected:
        res.status = "disconnected"
    elif res.status == 200 and not res.choices:
        res.status, res.error = "transport_error", "200 without any answer"
    if not res.disconnected:
        res.disconnect_phase = None
    return res


# ----------------------------------------------------------------------------- checks
def output_problems(req: SoakRequest, res: SoakResult) -> list[str]:
    """What is wrong with an answered (200, not disconnected) request's outputs."""
    import jsonschema

    probs = []
    if sorted(res.choices) != list(range(req.n)):
        probs.append(f"choices {sorted(res.choices)} for n={req.n}")
    for i, c in sorted(res.choices.items()):
        if c["finish"] not in ("stop", "length"):
            probs.append(f"choice {i} finished {c['finish']!r} (server abort: {res.error or c['text'][-80:]!r})")
            continue
        if c["finish"] == "stop" and req.constraint == "json":
            # strict=False: xgrammar (0.2.8) lets a string with maxLength hold raw control characters,
            # which strict JSON forbids (mlc-ai/xgrammar#800); counted apart, see json_control_chars().
            try:
                jsonschema.validate(json.loads(c["text"], strict=False), req.constraint_value)
            except (ValueError, jsonschema.ValidationError) as e:
                probs.append(f"choice {i}: output {c['text'][:80]!r} breaks the schema: {str(e)[:80]}")
        if c["finish"] == "stop" and req.constraint == "regex" and not re.fullmatch(req.constraint_value, c["text"]):
            probs.append(f"choice {i}: output {c['text'][:80]!r} does not match {req.constraint_value!r}")
        if req.logprobs:
            if c["lp"] is None:
                probs.append(f"choice {i}: no logprobs")
            elif req.api == "native":
                if c["lp"] != len(c["ids"]):
                    probs.append(f"choice {i}: {c['lp']} logprobs for {len(c['ids'])} tokens")
                if req.top_logprobs and any(t != req.top_logprobs for t in c["top"] or [None]):
                    probs.append(f"choice {i}: top logprobs not {req.top_logprobs} per token")
            elif c["lp"] == 0 and c["text"]:
                probs.append(f"choice {i}: no logprobs for {len(c['text'])} characters")
    if req.logprobs and req.api != "native" and res.usage and all(c["lp"] is not None for c in res.choices.values()):
        if sum(c["lp"] for c in res.choices.values()) != res.usage.get("completion_tokens"):
            probs.append(f"{sum(c['lp'] for c in res.choices.values())} logprobs for "
                         f"{res.usage.get('completion_tokens')} completion tokens")
    if req.greedy and len({json.dumps(o) for o in res.outputs()}) > 1:
        probs.append("greedy choices differ")
    return probs


def json_control_chars(req: SoakRequest, res: SoakResult) -> int:
    """Choices of a JSON-schema request whose output parses only leniently (raw control characters
    in a string: mlc-ai/xgrammar#800). Reported, not a failed check: the grammar backend's, not the server's."""
    n = 0
    for c in res.choices.values():
        if req.constraint == "json" and c["finish"] == "stop":
            try:
                json.loads(c["text"])
            except ValueError:
                n += 1
    return n


def leak_state(info: dict) -> list[str]:
    """What /get_server_info shows still held once everything is over (empty: nothing)."""
    s = info["internal_state"]
    bad = []
    if info.get("num_tracked_requests"):
        bad.append(f"{info['num_tracked_requests']} requests tracked by the HTTP server")
    for k in ("num_running", "num_waiting", "protected_tokens"):
        if s[k]:
            bad.append(f"{k} {s[k]}")
    if s["req_slots_free"] != s["req_slots_total"]:
        bad.append(f"request slots free {s['req_slots_free']} of {s['req_slots_total']}")
    if s["available_kv_tokens"] + s["evictable_tokens"] != s["max_total_num_tokens"]:
        bad.append(f"KV: available {s['available_kv_tokens']} + evictable {s['evictable_tokens']} != "
                   f"{s['max_total_num_tokens']}")
    return bad


async def drain(client, url: str, timeout: float) -> tuple[list[str], dict, float]:
    """Poll /get_server_info until nothing is held (or timeout); (leaks, last info, seconds waited)."""
    t0 = time.perf_counter()
    while True:
        info = (await client.get(url + "/get_server_info")).json()
        leaks = leak_state(info)
        if not leaks or time.perf_counter() - t0 > timeout:
            return leaks, info, time.perf_counter() - t0
        await asyncio.sleep(0.5)


def _pct(xs: list[float], p: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]


# ----------------------------------------------------------------------------- the run
async def soak(url: str, cfg: SoakConfig, log=print, proc=None) -> dict:
    """Run the soak against the server at `url` (`proc`: its process when the caller started it);
    returns the summary (summary["ok"]: every check passed)."""
    import httpx

    limits = httpx.Limits(max_connections=cfg.concurrency + 8, max_keepalive_connections=cfg.concurrency + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:
        info = (await client.get(url + "/get_server_info")).json()
        pool = info["max_total_num_tokens"]
        incremental = bool(info.get("incremental_streaming_output"))
        reqs = build_workload(cfg)
        await fit_workload(client, url, reqs, info["context_len"])
        load = offered_load(reqs, cfg.concurrency)
        log(f"soak: {len(reqs)} requests, concurrency {cfg.concurrency}, offered load {load:.0f} KV tokens "
            f"= {load / pool:.1f}x the pool of {pool}")
        stats0 = info["internal_state"]

        # --- the load
        queue = list(reversed(reqs))
        results: dict[int, SoakResult] = {}
        t0 = time.perf_counter()
        progress = {"done": 0}

        answered: list[float] = []

        def max_delay() -> float:
            if cfg.disconnect_max_delay is not None:
                return cfg.disconnect_max_delay
            return 1.5 * statistics.median(answered) if len(answered) >= 5 else 8.0

        async def worker():
            while queue:
                req = queue.pop()
                r = results[req.idx] = await run_request(client, url, req, cfg, incremental, max_delay=max_delay())
                if r.status == 200:
                    answered.append(r.latency)
                progress["done"] += 1
                if progress["done"] % max(1, len(reqs) // 10) == 0:
                    log(f"  {progress['done']}/{len(reqs)} requests in {time.perf_counter() - t0:.0f} s")

        await asyncio.gather(*[worker() for _ in range(cfg.concurrency)])
        duration = time.perf_counter() - t0

        # --- after the load: drained, flushable; then the quiet run: the greedy requests that were
        # answered, one at a time, no disconnects
        by_idx = {q.idx: q for q in reqs}
        greedy = [i for i, r in sorted(results.items())
                  if by_idx[i].greedy and r.status == 200 and not r.stream_error and r.choices]
        leaks = leaks_end = ["not checked"]
        after_load, drain_s, flush_ok, mismatches, replay_s, post_error = {}, 0.0, False, [], 0.0, None
        try:
            leaks, after, drain_s = await drain(client, url, cfg.drain_timeout)
            after_load = after["internal_state"]
            flush = await client.post(url + "/flush_cache")
            flushed = (await client.get(url + "/get_server_info")).json()["internal_state"]
            flush_ok = flush.status_code == 200 and flushed["available_kv_tokens"] == flushed["max_total_num_tokens"]
            if cfg.replay:
                t1 = time.perf_counter()
                for k, i in enumerate(greedy):
                    quiet = await run_request(client, url, by_idx[i], cfg, incremental, disconnect=False)
                    if quiet.status != 200 or quiet.outputs() != results[i].outputs():
                        mismatches.append({"idx": i, "kind": by_idx[i].kind, "features": by_idx[i].features(),
                                           "load": results[i].outputs(), "quiet": quiet.outputs(),
                                           "quiet_status": quiet.status})
                    if (k + 1) % max(1, len(greedy) // 5) == 0:
                        log(f"  replayed {k + 1}/{len(greedy)} greedy requests")
                replay_s = time.perf_counter() - t1
            leaks_end, _, _ = await drain(client, url, cfg.drain_timeout)
        except (httpx.HTTPError, KeyError, ValueError) as e:  # the server died, or answers 503
            post_error = f"{type(e).__name__}: {e}"[:300]
            log(f"the server failed after the load: {post_error}")
        try:
            health = (await client.get(url + "/health")).status_code
        except httpx.HTTPError:
            health = None

    # --- figures and checks
    res = [results[q.idx] for q in reqs]
    bad_status = [r for r in res if not r.disconnected and r.status not in cfg.allowed_statuses]
    fivexx = [r for r in res if isinstance(r.status, int) and r.status >= 500]
    hangs = [r for r in res if r.status == "hang" or r.latency > cfg.request_timeout]
    output_bad = {r.idx: p for r in res if r.status == 200 and not r.disconnected
                  for p in [output_problems(by_idx[r.idx], r)] if p}
    alive = health == 200 and (proc is None or proc.poll() is None)
    answered = [r.latency for r in res if r.status == 200]
    prompt_tokens = [r.prompt_tokens for r in res if r.prompt_tokens]
    by_kind: dict[str, Counter] = {}
    for r in res:
        by_kind.setdefault(r.kind, Counter())[str(r.status)] += 1
    features = Counter(f for q in reqs for f in q.features())
    checks = {
        "status": not bad_status,
        "no_5xx": not fivexx,
        "no_hangs": not hangs,
        "outputs": not output_bad,
        "alive": alive,
        "no_leaks": not leaks and not leaks_end,
        "flush": flush_ok,
        "greedy_equal": not mismatches and post_error is None,
    }
    summary = {
        "ok": all(checks.values()),
        "checks": checks,
        "config": {k: v for k, v in dataclasses.asdict(cfg).items()},
        "pool_tokens": pool,
        "offered_load_tokens": round(load),
        "offered_load_ratio": round(load / pool, 2),
        "mean_prompt_tokens_est": round(statistics.mean(q.est_prompt_tokens for q in reqs), 1),
        "mean_prompt_tokens_served": round(statistics.mean(prompt_tokens), 1) if prompt_tokens else None,
        "requests": len(res),
        "by_kind_status": {k: dict(v) for k, v in sorted(by_kind.items())},
        "by_status": dict(Counter(str(r.status) for r in res)),
        "features": dict(sorted(features.items())),
        "planned_disconnects": sum(q.disconnect is not None for q in reqs),
        "disconnects": sum(r.disconnected for r in res),
        "disconnect_phases": dict(Counter(r.disconnect_phase for r in res if r.disconnected)),
        "disconnect_modes": dict(Counter(f"{by_idx[r.idx].disconnect}:{r.disconnect_phase}" for r in res
                                         if r.disconnected)),
        "latency_p50_s": _pct(answered, 50),
        "latency_p99_s": _pct(answered, 99),
        "latency_max_s": max(answered, default=None),
        "latency_max_all_s": max((r.latency for r in res), default=None),
        "duration_s": round(duration, 1),
        "requests_per_s": round(len(res) / duration, 2),
        "bad_status": [{"idx": r.idx, "kind": r.kind, "status": r.status, "error": r.error} for r in bad_status][:20],
        "hangs": [r.idx for r in hangs],
        "output_problems": {str(k): v for k, v in list(output_bad.items())[:20]},
        "num_output_problems": len(output_bad),
        "json_control_chars": sum(json_control_chars(by_idx[r.idx], r) for r in res
                                  if r.status == 200 and not r.disconnected),
        "leaks_after_load": leaks,
        "leaks_after_replay": leaks_end,
        "drain_s": round(drain_s, 1),
        "state_after_load": {k: after_load.get(k) for k in ("max_total_num_tokens", "available_kv_tokens",
                                                             "evictable_tokens", "protected_tokens", "req_slots_total",
                                                             "req_slots_free", "num_running", "num_waiting")},
        "num_retracted": after_load.get("num_retracted", 0) - stats0.get("num_retracted", 0),
        "cache_hit_rate": after_load.get("cache_hit_rate"),
        "flush_ok": flush_ok,
        "post_load_error": post_error,
        "health": health,
        "greedy_replayed": len(greedy) if cfg.replay else 0,
        "greedy_matches": len(greedy) - len(mismatches) if cfg.replay else 0,
        "greedy_mismatches": len(mismatches),
        "mismatches": mismatches[:10],
        "replay_s": round(replay_s, 1),
    }
    summary["_results"] = res
    return summary


def format_summary(s: dict) -> str:
    lines = [
        f"requests {s['requests']} in {s['duration_s']} s ({s['requests_per_s']}/s); "
        f"pool {s['pool_tokens']} KV tokens, "
        f"offered load {s['offered_load_tokens']} ({s['offered_load_ratio']}x); mean prompt "
        f"{s['mean_prompt_tokens_est']} tokens (served: {s['mean_prompt_tokens_served']})",
        "by kind and status: " + "; ".join(f"{k} {v}" for k, v in s["by_kind_status"].items()),
        f"by status: {s['by_status']}",
        f"features: {s['features']}",
        f"disconnects {s['disconnects']} (planned {s['planned_disconnects']}): {s['disconnect_phases']}; "
        f"by mode: {s['disconnect_modes']}",
        "latency of answered requests: p50 {} s, p99 {} s, max {} s; longest request of all {} s".format(
            *(None if x is None else round(x, 2) for x in (s["latency_p50_s"], s["latency_p99_s"], s["latency_max_s"],
                                                           s["latency_max_all_s"]))),
        f"retractions {s['num_retracted']}, cache hit rate {s['cache_hit_rate']}",
        f"after the load (drained in {s['drain_s']} s): {s['state_after_load']}; "
        f"leaks {s['leaks_after_load'] or 'none'}; "
        f"after the replay: {s['leaks_after_replay'] or 'none'}; flush ok {s['flush_ok']}; /health {s['health']}",
        f"greedy replayed {s['greedy_replayed']} in {s['replay_s']} s: {s['greedy_matches']} equal, "
        f"{s['greedy_mismatches']} different",
    ]
    if s["post_load_error"]:
        lines.append(f"the server failed after the load: {s['post_load_error']}")
    if s["bad_status"]:
        lines.append(f"bad statuses: {s['bad_status']}")
    if s["json_control_chars"]:
        lines.append(f"JSON outputs with raw control characters in a string (xgrammar, mlc-ai/xgrammar#800): "
                     f"{s['json_control_chars']}")
    if s["output_problems"]:
        lines.append(f"output problems ({s['num_output_problems']}): {s['output_problems']}")
    for m in s["mismatches"]:
        lines.append(f"mismatch: {json.dumps(m)[:600]}")
    lines += [f"check {k}: {'ok' if v else 'FAILED'}" for k, v in s["checks"].items()]
    lines.append("SOAK OK" if s["ok"] else "SOAK FAILED")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI
def _range(s: str) -> tuple[int, int]:
    lo, _, hi = s.partition(",")
    lo, hi = int(lo), int(hi or lo)
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"need LO,HI with 0 < LO <= HI, got {s!r}")
    return lo, hi


def parser() -> argparse.ArgumentParser:
    d = SoakConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server")
    where.add_argument("--server-args", help="start `radixlm serve` with these arguments (one string; write "
                       "--server-args=--flag when it is a single flag)")
    p.add_argument("--num-requests", type=int, default=d.num_requests)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--disconnect-rate", type=float, default=d.disconnect_rate)
    p.add_argument("--disconnect-max-delay", type=float, default=d.disconnect_max_delay,
                   help="seconds: timed disconnects happen within this (default: 1.5x the median latency so far)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--request-timeout", type=float, default=d.request_timeout,
                   help="the hang bound: seconds within which every request must end")
    p.add_argument("--max-new-tokens", type=_range, default=d.max_new_tokens, metavar="LO,HI")
    p.add_argument("--short-words", type=_range, default=d.short_words, metavar="LO,HI",
                   help="short prompts' sizes in words (about a token each)")
    p.add_argument("--long-words", type=_range, default=d.long_words, metavar="LO,HI",
                   help="long prompts' sizes in words; they share prefixes of --num-docs documents")
    p.add_argument("--long-fraction", type=float, default=d.long_fraction)
    p.add_argument("--num-docs", type=int, default=d.num_docs)
    p.add_argument("--greedy-fraction", type=float, default=d.greedy_fraction)
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout)
    p.add_argument("--no-replay", action="store_true", help="skip the quiet replay of greedy requests")
    p.add_argument("--output", help="write the JSON summary here")
    p.add_argument("--requests-output", help="write one JSON line per request here")
    return p


def config_from_args(a: argparse.Namespace) -> SoakConfig:
    return SoakConfig(
        num_requests=a.num_requests, concurrency=a.concurrency, seed=a.seed, disconnect_rate=a.disconnect_rate,
        disconnect_max_delay=a.disconnect_max_delay, request_timeout=a.request_timeout, max_new_tokens=a.max_new_tokens,
        short_words=a.short_words, long_words=a.long_words, long_fraction=a.long_fraction, num_docs=a.num_docs,
        greedy_fraction=a.greedy_fraction, drain_timeout=a.drain_timeout, replay=not a.no_replay,
    )


def run(url: Optional[str], cfg: SoakConfig, server_args: Optional[list[str]] = None, log=print,
        start_timeout: float = 600) -> dict:
    """The soak against `url`, or against a server started here with `server_args` (stopped after)."""
    server = None
    if url is None:
        from radixlm.server.process import ServerProcess

        server = ServerProcess(*(server_args or []), timeout=start_timeout)
        url = server.url
    try:
        summary = asyncio.run(soak(url, cfg, log=log, proc=server.proc if server else None))
    except BaseException:
        if server is not None:
            print("server log (tail):\n" + server.output()[-4000:], file=sys.stderr)
        raise
    finally:
        if server is not None:
            alive = server.proc.poll() is None
            code = server.stop()
            tail = server.output()[-4000:]
    if server is not None:
        summary["server_exit_code"] = code
        summary["server_alive_at_end"] = alive
        if not summary["ok"]:
            summary["server_log_tail"] = tail
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    a = parser().parse_args(argv)
    cfg = config_from_args(a)
    t0 = time.time()
    summary = run(a.url, cfg, shlex.split(a.server_args) if a.server_args else None)
    results = summary.pop("_results")
    summary["command"] = " ".join(shlex.quote(x) for x in (sys.argv if argv is None else ["soak.py", *argv]))
    summary["wall_s"] = round(time.time() - t0, 1)
    print(format_summary(summary))
    if summary.get("server_log_tail"):
        print("server log (tail):\n" + summary["server_log_tail"])
    if a.output:
        with open(a.output, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    if a.requests_output:
        with open(a.requests_output, "w") as f:
            for r in results:
                f.write(json.dumps(dataclasses.asdict(r), default=str) + "\n")
    return 0 if summary["ok"] else 1
