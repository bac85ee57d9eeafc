"""OpenAI chat answers -> Anthropic's Messages answers: a chat.completion body -> a message, and a
chat.completion.chunk sequence -> Anthropic's stream events, in Anthropic's order:
message_start, then per content block content_block_start / content_block_delta (text_delta,
thinking_delta, input_json_delta) / content_block_stop, then message_delta (stop_reason,
stop_sequence, usage) and message_stop.

Pure functions of OpenAI's shapes (message.content / reasoning_content / tool_calls,
delta.content / reasoning_content / tool_calls, finish_reason incl. "tool_calls", usage with
prompt_tokens_details.cached_tokens), so they are tested on hand-written OpenAI bodies.
Usage follows Anthropic's definition: input_tokens + cache_read_input_tokens is the whole prompt
(SGLang reports the whole prompt as input_tokens and the cached part again).
"""

from __future__ import annotations

import json
import uuid
from typing import Any


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(
    finish_reason: str | None, matched: Any, stop_sequences: list[str], called: bool = False
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). An answer with tool calls is "tool_use" (whatever finish_reason
    says: OpenAI reports "stop" for a forced call); a stop string the request gave is
    "stop_sequence"; the end of turn, a chat template's own stop string or an EOS token is
    "end_turn". An abort has no Anthropic name: "end_turn", as in SGLang."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "tool_calls" or called:
        return "tool_use", None
    if finish_reason == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


def usage(u: dict | None) -> dict:
    u = u or {}
    prompt = u.get("prompt_tokens", 0)
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return {
        "input_tokens": prompt - cached,
        "output_tokens": u.get("completion_tokens", 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _tool_input(arguments: str) -> dict:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        value = None
    # A call's arguments are an object by the tool-call parsers' contract; anything else is a bug
    # upstream.
    if not isinstance(value, dict):
        raise RuntimeError(
            f"the model's tool call arguments are not a JSON object: {arguments[:200]!r}"
        )
    return value


def message_from_chat(body: dict, model: str, stop_sequences: list[str]) -> dict:
    """A chat.completion body (one choice) -> an Anthropic message."""
    choice = body["choices"][0]
    msg = choice["message"]
    content: list[dict] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": _tool_input(fn["arguments"]),
            }
        )
    reason, sequence = stop_reason(
        choice.get("finish_reason"),
        choice.get("matched_stop"),
        stop_sequences,
        bool(msg.get("tool_calls")),
    )
    return {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(body.get("usage")),
    }


class StreamConverter:
    """chat.completion.chunk bodies in, Anthropic stream events (dicts) out; `start()` first,
    `feed(chunk)` for each chunk, `finish()` last. One block is open at a time: a change of kind
    (thinking -> text -> a tool call) closes the open block and opens the next."""

    def __init__(self, model: str, stop_sequences: list[str]):
        self.model, self.stop_sequences = model, stop_sequences
        self.index = -1  # the open block's index
        self.open_kind: str | None = None  # "thinking", "text", or "tool:<call index>"
        self.finish_reason: str | None = None
        self.matched: Any = None
        self.usage: dict | None = None
        self.tool_blocks: dict[int, int] = {}  # OpenAI's tool call index -> its block's index

    def start(self) -> list[dict]:
        message = {
            "id": new_message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(None),
        }
        return [{"type": "message_start", "message": message}]

    def _close(self) -> list[dict]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _open(self, kind: str, block: dict) -> list[dict]:
        events = self._close()
        self.index += 1
        self.open_kind = kind
        return events + [
            {"type": "content_block_start", "index": self.index, "content_block": block}
        ]

    def _delta(self, kind: str, block: dict, delta: dict) -> list[dict]:
        events = self._open(kind, block) if self.open_kind != kind else []
        return events + [{"type": "content_block_delta", "index": self.index, "delta": delta}]

    def feed(self, chunk: dict) -> list[dict]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: list[dict] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._delta(
                    "thinking",
                    {"type": "thinking", "thinking": "", "signature": ""},
                    {"type": "thinking_delta", "thinking": delta["reasoning_content"]},
                )
            if delta.get("content"):
                events += self._delta(
                    "text",
                    {"type": "text", "text": ""},
                    {"type": "text_delta", "text": delta["content"]},
                )
            for call in delta.get("tool_calls") or []:
                events += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason, self.matched = (
                    choice["finish_reason"],
                    choice.get("matched_stop"),
                )
        return events

    def _tool_call(self, call: dict) -> list[dict]:
        # OpenAI's pieces: the first carries id and name, later ones (same index) argument text.
        n = call.get("index", 0)
        fn = call.get("function") or {}
        events: list[dict] = []
        if call.get("id") is not None:
            events += self._open(
                f"tool:{n}",
                {"type": "tool_use", "id": call["id"], "name": fn.get("name", ""), "input": {}},
            )
            self.tool_blocks[n] = self.index
        if n not in self.tool_blocks:
            raise RuntimeError(f"tool call {n}'s arguments came before its id and name")
        if fn.get("arguments"):  # to its own block (the client accumulates by index)
            events.append(
                {
                    "type": "content_block_delta",
                    "index": self.tool_blocks[n],
                    "delta": {"type": "input_json_delta", "partial_json": fn["arguments"]},
                }
            )
        return events

    def finish(self) -> list[dict]:
        reason, sequence = stop_reason(
            self.finish_reason, self.matched, self.stop_sequences, bool(self.tool_blocks)
        )
        u = usage(self.usage)
        return self._close() + [
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": u,
            },
            {"type": "message_stop"},
        ]


def error_body(kind: str, message: str) -> dict:
    """Anthropic's error shape (a response body, and the data of a stream's error event)."""
    return {"type": "error", "error": {"type": kind, "message": message}}


# Anthropic's error types by status (its errors page); other 4xx are invalid requests, 5xx api
# errors.
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
