"""OpenAI stream chunks -> Ollama's answers: the chat.completion.chunk (or text_completion) stream
the pipelines return becomes Ollama's NDJSON objects (`message` for /api/chat, `response` for
/api/generate), the last one `done` with Ollama's done fields; a whole (stream false) answer is
the same objects collected into one, as Ollama's server collects its own stream.

Pure functions of OpenAI's chunk shapes (delta.content / reasoning_content / tool_calls, text,
finish_reason, the usage chunk, the finishing chunk's token ids), so they are tested on
hand-written chunks. Durations are nanoseconds: prompt_eval_duration runs from the request's
arrival to its first output (tokenizing, queueing and prefill), eval_duration from there to the
end; load_duration is 0 (the model is loaded before the server answers).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any


def now_iso() -> str:
    """Ollama's created_at: RFC 3339 with nanoseconds' worth of digits in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def done_reason(finish_reason: str | None) -> str:
    # Ollama's reasons: "stop" (an end of turn or stop string; tool calls too) and "length".
    return "length" if finish_reason == "length" else "stop"


def _arguments(text: str, name: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        value = None
    # A call's arguments are an object by the tool-call parsers' contract; anything else is a
    # bug upstream (a 500, not a malformed answer).
    if not isinstance(value, dict):
        raise RuntimeError(f"tool call {name!r}: the arguments are not a JSON object: {text!r}")
    return value


class OllamaStream:
    """Chunks in (`feed`), Ollama's objects out; `final()` last. chat: /api/chat's `message`
    shape, else /api/generate's `response`. context: the generate `context` (the finishing
    chunk's prompt and output token ids) goes into the final object."""

    def __init__(self, model: str, chat: bool, started_ns: int, context: bool = False):
        self.model, self.chat, self.context = model, chat, context
        self.started_ns = started_ns
        self.first_ns: int | None = None
        self.finish_reason: str | None = None
        self.usage: dict = {}
        self.ids: list[int] | None = None
        self.calls: dict[int, dict] = {}  # OpenAI's tool call index -> {"name", "arguments"}

    def _object(self, content: str, thinking: str, logprobs: list | None = None) -> dict:
        out: dict[str, Any] = {"model": self.model, "created_at": now_iso()}
        if self.chat:
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            out["message"] = msg
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        if logprobs:
            out["logprobs"] = logprobs
        out["done"] = False
        return out

    def feed(self, chunk: dict) -> list[dict]:
        if self.first_ns is None:
            self.first_ns = time.perf_counter_ns()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content = delta.get("content") or choice.get("text") or ""
            thinking = delta.get("reasoning_content") or ""
            lps = (choice.get("logprobs") or {}).get("content")  # a chat chunk's entries
            for call in delta.get("tool_calls") or []:
                self._call_piece(call)
            if content or thinking or lps:
                out.append(self._object(content, thinking, lps))
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                if "token_ids" in choice:
                    self.ids = [*choice["prompt_token_ids"], *choice["token_ids"]]
                if self.calls:  # Ollama sends each call whole, in a chunk of its own
                    out.append(self._with_calls(self._object("", "")))
        return out

    def _call_piece(self, call: dict) -> None:
        fn = call.get("function") or {}
        entry = self.calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
        entry["name"] += fn.get("name") or ""
        entry["arguments"] += fn.get("arguments") or ""

    def _with_calls(self, obj: dict) -> dict:
        calls = [
            {
                "function": {
                    "index": i,
                    "name": c["name"],
                    "arguments": _arguments(c["arguments"], c["name"]),
                }
            }
            for i, c in sorted(self.calls.items())
        ]
        obj["message"]["tool_calls"] = calls
        return obj

    def final(self) -> dict:
        end = time.perf_counter_ns()
        first = self.first_ns if self.first_ns is not None else end
        out = self._object("", "")
        out.update(
            done=True,
            done_reason=done_reason(self.finish_reason),
            total_duration=end - self.started_ns,
            load_duration=0,
            prompt_eval_count=self.usage.get("prompt_tokens", 0),
            prompt_eval_duration=first - self.started_ns,
            eval_count=self.usage.get("completion_tokens", 0),
            eval_duration=end - first,
        )
        if self.context and self.ids is not None:
            out["context"] = self.ids
        return out


def collect(objects: list[dict]) -> dict:
    """A stream's objects as one answer (Ollama's stream false): the texts joined, the tool calls
    and logprobs gathered, the final object's done fields."""
    whole = dict(objects[-1])
    texts: dict[str, list[str]] = {"content": [], "thinking": []}
    calls: list = []
    logprobs: list = []
    for o in objects:
        part = o.get("message", o)
        texts["content"].append(part.get("content", o.get("response", "")) or "")
        texts["thinking"].append(part.get("thinking") or "")
        calls += part.get("tool_calls") or []
        logprobs += o.get("logprobs") or []
    content, thinking = "".join(texts["content"]), "".join(texts["thinking"])
    if "message" in whole:
        msg = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if calls:
            msg["tool_calls"] = calls
        whole["message"] = msg
    else:
        whole["response"] = content
        if thinking:
            whole["thinking"] = thinking
    if logprobs:
        whole["logprobs"] = logprobs
    return whole
