"""The chat pipeline's answers as OpenAI Responses objects: a chat.completion body as a Response's
output items (reasoning, message with output_text, function_call), and a stream of
chat.completion.chunk bodies as Responses' streaming events in OpenAI's order.

Input shapes are OpenAI chat's: message.content / reasoning_content / tool_calls
[{id, type, function: {name, arguments}}], finish_reason (stop, length, tool_calls, abort), and
delta.content / reasoning_content / tool_calls [{index, id?, function: {name?, arguments piece}}].
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

from radixlm.server import responses_custom_tools as custom_tools


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [text_part(text)],
    }


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def usage(chat_usage: dict | None) -> dict | None:
    """Chat's usage as Responses' (input/output tokens, cached and reasoning tokens)."""
    if chat_usage is None:
        return None
    inp, out = chat_usage["prompt_tokens"], chat_usage["completion_tokens"]
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    # The radix cache keeps every prompt token it computed: what was not read from it was written.
    details = {"cached_tokens": cached, "cache_write_tokens": inp - cached}
    return {
        "input_tokens": inp,
        "input_tokens_details": details,
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": inp + out,
    }


def status_of(finish_reason: str | None) -> tuple[str, dict | None]:
    """(status, incomplete_details) for a chat finish_reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish_reason == "abort":
        return "cancelled", None
    return "completed", None


def output_items(message: dict, custom: set[str] = frozenset()) -> list[dict]:
    """A chat.completion's message as output items (calls of the `custom` tools as
    custom_tool_call items). A message item comes whenever there is text or no call at all, so
    output_text always has something to read."""
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(new_id("msg"), message.get("content") or ""))
    for c in calls:
        name, args = c["function"]["name"], c["function"]["arguments"]
        if name in custom:
            items.append(
                custom_tools.custom_item(new_id("ctc"), c["id"], name, custom_tools.input_of(args))
            )
        else:
            items.append(call_item(new_id("fc"), c["id"], name, args))
    return items


def assistant_message(items: list[dict]) -> dict:
    """The output items as the assistant message a continuation renders after this turn."""
    text = "".join(p["text"] for it in items if it["type"] == "message" for p in it["content"])
    calls = [
        custom_tools.input_call(it, "output")
        if it["type"] == "custom_tool_call"
        else {
            "id": it["call_id"],
            "type": "function",
            "function": {"name": it["name"], "arguments": it["arguments"]},
        }
        for it in items
        if it["type"] in ("function_call", "custom_tool_call")
    ]
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


@dataclasses.dataclass
class Shell:
    """What every Response object of one request repeats (the request's echo)."""

    id: str
    model: str
    request: dict  # the echoed request fields: instructions, tools, tool_choice, temperature, ...
    created_at: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: str,
        output: list,
        usage: dict | None = None,
        incomplete: dict | None = None,
        error: dict | None = None,
    ) -> dict:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
            "incomplete_details": incomplete,
            "error": error,
            **self.request,
        }


def response_body(shell: Shell, chat: dict) -> dict:
    """A non-streamed chat.completion as the Response."""
    choice = chat["choices"][0]
    status, incomplete = status_of(choice["finish_reason"])
    items = output_items(choice["message"], custom_tools.custom_names(shell.request.get("tools")))
    return shell.body(status, items, usage(chat.get("usage")), incomplete)


@dataclasses.dataclass
class _Open:
    """The output item a stream is writing."""

    kind: str  # reasoning | message | function_call | custom_tool_call
    index: int  # its output_index
    item: dict
    text: str = ""
    tool_index: int | None = None  # the chat tool call it is


class EventStream:
    """Chat chunks in, Responses events out (each with its sequence_number). Feed every chunk to
    `chunk`, then call `finish` for the closing events; `output` is the items so far."""

    def __init__(self, shell: Shell):
        self.shell = shell
        self.custom = custom_tools.custom_names(shell.request.get("tools"))
        self.seq = 0
        self.output: list[dict] = []
        self.open: _Open | None = None
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.final: dict | None = None  # the Response, once finished

    def _ev(self, kind: str, **fields) -> dict:
        ev = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return ev

    def start(self) -> list[dict]:
        r = self.shell.body("in_progress", [])
        return [
            self._ev("response.created", response=r),
            self._ev("response.in_progress", response=r),
        ]

    def chunk(self, chunk: dict) -> list[dict]:
        if chunk.get("usage"):
            self.usage = usage(chunk["usage"])
        evs: list[dict] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                evs += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                evs += self._text("message", delta["content"])
            for tc in delta.get("tool_calls") or []:
                evs += self._call(tc)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return evs

    def _begin(self, kind: str, item: dict, tool_index: int | None = None) -> list[dict]:
        evs = self._close()
        self.open = _Open(kind, len(self.output), item, tool_index=tool_index)
        self.output.append(item)
        evs.append(
            self._ev("response.output_item.added", output_index=self.open.index, item=dict(item))
        )
        if kind == "message":
            evs.append(
                self._ev(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self.open.index,
                    content_index=0,
                    part=text_part(""),
                )
            )
        return evs

    def _text(self, kind: str, delta: str) -> list[dict]:
        evs = []
        if self.open is None or self.open.kind != kind:
            item = (
                reasoning_item(new_id("rs"), "", "in_progress")
                if kind == "reasoning"
                else message_item(new_id("msg"), None, "in_progress")
            )
            if kind == "reasoning":
                item["content"] = []
            evs += self._begin(kind, item)
        o = self.open
        o.text += delta
        name = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        extra = {} if kind == "reasoning" else {"logprobs": []}
        evs.append(
            self._ev(
                name,
                item_id=o.item["id"],
                output_index=o.index,
                content_index=0,
                delta=delta,
                **extra,
            )
        )
        return evs

    def _call(self, tc: dict) -> list[dict]:
        evs = []
        fn = tc.get("function") or {}
        idx = tc.get("index", 0)
        if self.open is None or self.open.kind == "message" or self.open.tool_index != idx:
            call_id, name = tc.get("id") or new_id("call"), fn.get("name") or ""
            if name in self.custom:  # its input is sent whole when the call ends
                item = custom_tools.custom_item(new_id("ctc"), call_id, name, "")
                evs += self._begin("custom_tool_call", item, tool_index=idx)
            else:
                item = call_item(new_id("fc"), call_id, name, "", "in_progress")
                evs += self._begin("function_call", item, tool_index=idx)
        o = self.open
        if fn.get("name") and not o.item["name"]:
            o.item["name"] = fn["name"]
        if o.kind == "custom_tool_call":
            o.text += fn.get("arguments") or ""
        elif fn.get("arguments"):
            o.text += fn["arguments"]
            evs.append(
                self._ev(
                    "response.function_call_arguments.delta",
                    item_id=o.item["id"],
                    output_index=o.index,
                    delta=fn["arguments"],
                )
            )
        return evs

    def _close(self) -> list[dict]:
        o, self.open = self.open, None
        if o is None:
            return []
        iid, evs = o.item["id"], []
        if o.kind == "message":
            o.item["content"] = [text_part(o.text)]
            evs.append(
                self._ev(
                    "response.output_text.done",
                    item_id=iid,
                    output_index=o.index,
                    content_index=0,
                    text=o.text,
                    logprobs=[],
                )
            )
            evs.append(
                self._ev(
                    "response.content_part.done",
                    item_id=iid,
                    output_index=o.index,
                    content_index=0,
                    part=text_part(o.text),
                )
            )
        elif o.kind == "reasoning":
            o.item["content"] = [{"type": "reasoning_text", "text": o.text}]
            evs.append(
                self._ev(
                    "response.reasoning_text.done",
                    item_id=iid,
                    output_index=o.index,
                    content_index=0,
                    text=o.text,
                )
            )
        elif o.kind == "custom_tool_call":
            o.item["input"] = text = custom_tools.input_of(o.text)
            for kind, field in (("delta", "delta"), ("done", "input")):
                evs.append(
                    self._ev(
                        f"response.custom_tool_call_input.{kind}",
                        item_id=iid,
                        output_index=o.index,
                        **{field: text},
                    )
                )
        else:
            o.item["arguments"] = o.text
            evs.append(
                self._ev(
                    "response.function_call_arguments.done",
                    item_id=iid,
                    output_index=o.index,
                    name=o.item["name"],
                    arguments=o.text,
                )
            )
        if "status" in o.item:
            o.item["status"] = "completed"
        evs.append(self._ev("response.output_item.done", output_index=o.index, item=o.item))
        return evs

    def finish(self) -> list[dict]:
        """The closing events: the open item's, then response.completed (or .incomplete)."""
        evs = self._close()
        if not self.output:  # nothing generated: an empty message, as the non-streamed body has
            evs += (
                self._begin("message", message_item(new_id("msg"), None, "in_progress"))
                + self._close()
            )
        status, incomplete = status_of(self.finish_reason)
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            status, "response.failed"
        )
        self.final = self.shell.body(status, self.output, self.usage, incomplete)
        return evs + [self._ev(kind, response=self.final)]

    def failed(self, status: int, message: str) -> Iterator[dict]:
        """An error after the stream started: an error event, then response.failed."""
        yield self._ev("error", code=str(status), message=message, param=None)
        err = {"code": "server_error" if status >= 500 else "invalid_request", "message": message}
        yield self._ev(
            "response.failed",
            response=self.shell.body("failed", self.output, self.usage, error=err),
        )


def echo_fields(req: Any, tools: list | None, tool_choice: Any) -> dict[str, Any]:
    """The request fields a Response repeats, with OpenAI's defaults where the request left them."""
    return {
        "instructions": req.instructions,
        "metadata": req.metadata or {},
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": tool_choice or "auto",
        "tools": tools or [],
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning.model_dump() if req.reasoning else None,
        "store": bool(req.store),
        "text": {"format": (req.text.format if req.text else None) or {"type": "text"}},
        "truncation": req.truncation or "disabled",
        "user": req.user,
        "background": False,
    }
