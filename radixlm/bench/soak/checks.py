"""The soak's checks of the server's answers (outputs) and of what it holds once the load is
over."""

from __future__ import annotations

import asyncio
import json
import re
import time

from radixlm.bench.soak.client import SoakResult
from radixlm.bench.soak.workload import SoakRequest


def output_problems(req: SoakRequest, res: SoakResult) -> list[str]:
    """What is wrong with an answered (200, not disconnected) request's outputs."""
    import jsonschema

    probs = []
    if sorted(res.choices) != list(range(req.n)):
        probs.append(f"choices {sorted(res.choices)} for n={req.n}")
    for i, c in sorted(res.choices.items()):
        if c["finish"] not in ("stop", "length"):
            probs.append(
                f"choice {i} finished {c['finish']!r} (server abort:"
                f" {res.error or c['text'][-80:]!r})"
            )
            continue
        if c["finish"] == "stop" and req.constraint == "json":
            # strict=False: xgrammar (0.2.8) lets a string with maxLength hold raw control
            # characters, which strict JSON forbids (mlc-ai/xgrammar#800); counted apart, see
            # json_control_chars().
            try:
                jsonschema.validate(json.loads(c["text"], strict=False), req.constraint_value)
            except (ValueError, jsonschema.ValidationError) as e:
                probs.append(
                    f"choice {i}: output {c['text'][:80]!r} breaks the schema: {str(e)[:80]}"
                )
        if (
            c["finish"] == "stop"
            and req.constraint == "regex"
            and not re.fullmatch(req.constraint_value, c["text"])
        ):
            probs.append(
                f"choice {i}: output {c['text'][:80]!r} does not match {req.constraint_value!r}"
            )
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
    if (
        req.logprobs
        and req.api != "native"
        and res.usage
        and all(c["lp"] is not None for c in res.choices.values())
    ):
        if sum(c["lp"] for c in res.choices.values()) != res.usage.get("completion_tokens"):
            probs.append(
                f"{sum(c['lp'] for c in res.choices.values())} logprobs for "
                f"{res.usage.get('completion_tokens')} completion tokens"
            )
    if req.greedy and len({json.dumps(o) for o in res.outputs()}) > 1:
        probs.append("greedy choices differ")
    return probs


def json_control_chars(req: SoakRequest, res: SoakResult) -> int:
    """Choices of a JSON-schema request whose output parses only leniently (raw control characters
    in a string: mlc-ai/xgrammar#800). Reported, not a failed check: the grammar backend's, not the
    server's.
    """
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
        bad.append(
            f"KV: available {s['available_kv_tokens']} + evictable {s['evictable_tokens']} != "
            f"{s['max_total_num_tokens']}"
        )
    return bad


async def drain(client, url: str, timeout: float) -> tuple[list[str], dict, float]:
    """Poll /get_server_info until nothing is held (or timeout); (leaks, last info, seconds
    waited)."""
    t0 = time.perf_counter()
    while True:
        info = (await client.get(url + "/get_server_info")).json()
        leaks = leak_state(info)
        if not leaks or time.perf_counter() - t0 > timeout:
            return leaks, info, time.perf_counter() - t0
        await asyncio.sleep(0.5)
