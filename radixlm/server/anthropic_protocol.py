"""Anthropic's Messages API requests (POST /v1/messages, /v1/messages/count_tokens) and their
translation into the OpenAI chat request the chat pipeline runs (chat_pipeline.open_chat).

The models are strict (an unknown or mistyped field is a 400 naming it, as Anthropic answers);
content blocks are checked by hand so that a bad block is named by its path
(`messages.2.content.0.tool_use_id`). What maps where, as SGLang's adapter does:
system -> a system message; tool_use blocks -> the assistant's tool_calls; tool_result blocks ->
`tool` messages; tools -> OpenAI function tools; tool_choice auto / any / tool / none -> auto /
required / a named function / none; stop_sequences -> stop. Earlier turns' thinking blocks are
dropped (Anthropic strips them from the context too); cache_control is accepted and ignored (the
radix cache reuses every shared prefix without being asked). Claude Code's billing line, the one
volatile field of its prompts, is normalized in the system prompt (billing_header.py).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixlm.reasoning import get_reasoning_format
from radixlm.server.billing_header import normalize_billing_header
from radixlm.server.openai_protocol import RequestError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[dict]


class Thinking(_Strict):
    type: Literal[
        "enabled", "disabled", "adaptive"
    ]  # adaptive: the model thinks as long as it wants
    budget_tokens: int | None = Field(None, ge=1)
    display: str | None = None


class CountTokensRequest(_Strict):
    model: str | None = None  # any name, as the chat route takes it
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict] | None = None
    tools: list[dict] | None = None
    tool_choice: dict | None = None
    thinking: Thinking | None = None
    cache_control: dict | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = False
    metadata: dict | None = None
    service_tier: Literal["auto", "standard_only"] | None = (
        None  # one tier here: accepted, changes nothing
    )


def _text_of(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise RequestError(f"{where}.text: a text block needs a string field text", f"{where}.text")
    return text


def _check_block(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise RequestError(
            f"{where}: each content block must be an object with a string type", where
        )
    if block["type"] in ("image", "document"):
        raise RequestError(
            f"{where}: {block['type']}s are not supported (this server takes text only)", where
        )
    return block["type"]


def system_text(system: str | list[dict] | None, normalize_billing: bool = False) -> str | None:
    """The system prompt: a string, or text blocks joined with newlines (as vLLM joins text
    parts); normalize_billing: each block's leading Claude Code billing line normalized."""
    fix = normalize_billing_header if normalize_billing else (lambda text: text)
    if system is None or isinstance(system, str):
        return fix(system) if system else None
    parts = []
    for j, block in enumerate(system):
        where = f"system.{j}"
        if _check_block(block, where) != "text":
            raise RequestError(
                f"{where}: the system prompt takes text blocks only, got {block['type']!r}", where
            )
        parts.append(fix(_text_of(block, where)))
    return "\n".join(parts) or None


def _tool_result_text(block: dict, where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if _check_block(part, f"{where}.content.{k}") != "text":
                raise RequestError(
                    f"{where}.content.{k}: a tool_result holds text blocks only, got "
                    f"{part['type']!r}",
                    f"{where}.content.{k}",
                )
            texts.append(_text_of(part, f"{where}.content.{k}"))
        text = "\n".join(texts)
    else:
        raise RequestError(
            f"{where}.content: must be a string or a list of text blocks", f"{where}.content"
        )
    if not isinstance(block.get("is_error", False), bool):
        raise RequestError(f"{where}.is_error: must be a boolean", f"{where}.is_error")
    # OpenAI's tool message has no error flag: the model reads that the call failed.
    return f"Error: {text}" if block.get("is_error") else text


def _tool_call(block: dict, where: str) -> dict:
    for key, kind in (("id", str), ("name", str), ("input", dict)):
        if not isinstance(block.get(key), kind):
            raise RequestError(
                f"{where}.{key}: a tool_use block needs"
                f" {'an object' if kind is dict else 'a string'} field {key}",
                f"{where}.{key}",
            )
    return {
        "id": block["id"],
        "type": "function",
        "function": {
            "name": block["name"],
            "arguments": json.dumps(block["input"], ensure_ascii=False),
        },
    }


def _convert_message(i: int, msg: Message, prior_tool_ids: set[str]) -> list[dict]:
    """One Anthropic message -> OpenAI messages: a user's tool_result blocks become `tool` messages
    (in block order, text between them a user message); an assistant's tool_use blocks its
    tool_calls.
    """
    if isinstance(msg.content, str):
        return [{"role": msg.role, "content": msg.content}]
    out: list[dict] = []
    texts: list[dict] = []
    calls: list[dict] = []
    for j, block in enumerate(msg.content):
        where = f"messages.{i}.content.{j}"
        kind = _check_block(block, where)
        if kind == "text":
            texts.append({"type": "text", "text": _text_of(block, where)})
        elif kind in ("thinking", "redacted_thinking") and msg.role == "assistant":
            continue
        elif kind == "tool_use" and msg.role == "assistant":
            calls.append(_tool_call(block, where))
        elif kind == "tool_result" and msg.role == "user":
            tid = block.get("tool_use_id")
            if not isinstance(tid, str) or tid not in prior_tool_ids:
                raise RequestError(
                    f"{where}.tool_use_id: {tid!r} matches no tool_use block in the previous "
                    "(assistant) message; each tool_result must answer a tool_use of that message",
                    f"{where}.tool_use_id",
                )
            if texts:
                out.append({"role": "user", "content": texts})
                texts = []
            out.append(
                {"role": "tool", "tool_call_id": tid, "content": _tool_result_text(block, where)}
            )
        else:
            raise RequestError(
                f"{where}: a {msg.role} message cannot hold a {kind!r} block", f"{where}.type"
            )
    if texts or calls or not out:
        m: dict = {"role": msg.role, "content": texts}
        if calls:
            m["tool_calls"] = calls
        out.append(m)
    return out


def _tools(tools: list[dict]) -> list[dict]:
    out = []
    for j, tool in enumerate(tools):
        where = f"tools.{j}"
        if not isinstance(tool, dict):
            raise RequestError(f"{where}: must be an object", where)
        if tool.get("type", "custom") not in ("custom", None):
            raise RequestError(
                f"{where}.type: server tools ({tool['type']!r}) are not supported; define a client "
                "tool with name, description and input_schema",
                f"{where}.type",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise RequestError(
                f"{where}.name: a tool needs a non-empty string name", f"{where}.name"
            )
        if not isinstance(tool.get("input_schema"), dict):
            raise RequestError(
                f"{where}.input_schema: a tool needs a JSON-schema object input_schema",
                f"{where}.input_schema",
            )
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict | None, names: list[str]) -> dict:
    """Anthropic's tool_choice -> the chat request's tool_choice (and parallel_tool_calls)."""
    if choice is None:
        return {"tool_choice": "auto"} if names else {}
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise RequestError(
            f"tool_choice.type: must be auto, any, tool or none, got {kind!r}", "tool_choice.type"
        )
    if kind != "none" and not names:
        raise RequestError(f"tool_choice {kind!r} needs tools", "tool_choice")
    out: dict = {}
    if kind == "tool":
        if choice.get("name") not in names:
            raise RequestError(
                f"tool_choice.name: {choice.get('name')!r} is not one of the tools"
                f" ({', '.join(names)})",
                "tool_choice.name",
            )
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def _thinking(req: CountTokensRequest, reasoning_parser: str | None) -> dict:
    """thinking -> the chat request's: the format's switch (Qwen3's enable_thinking, ...) in
    chat_template_kwargs, and budget_tokens as max_thinking_tokens (server/thinking_params.py).
    Left out: the server's default. Thinking needs --reasoning-parser (the think block's markers).
    """
    t = req.thinking
    if t is None:
        return {}
    on = t.type != "disabled"
    if on and reasoning_parser is None:
        raise RequestError(
            "thinking: extended thinking needs a server started with --reasoning-parser", "thinking"
        )
    if t.type == "enabled":
        if t.budget_tokens is None:
            raise RequestError(
                "thinking.budget_tokens: required when thinking is enabled",
                "thinking.budget_tokens",
            )
        if isinstance(req, MessagesRequest) and t.budget_tokens >= req.max_tokens:
            raise RequestError(
                f"thinking.budget_tokens: must be less than max_tokens ({req.max_tokens}), got "
                f"{t.budget_tokens}",
                "thinking.budget_tokens",
            )
    out: dict = {"max_thinking_tokens": t.budget_tokens} if t.type == "enabled" else {}
    switch = get_reasoning_format(reasoning_parser).switch if reasoning_parser else None
    if switch is not None:
        out["chat_template_kwargs"] = {switch: on}
    return out


def chat_body(
    req: CountTokensRequest, reasoning_parser: str | None = None, normalize_billing: bool = True
) -> dict:
    """The OpenAI chat request (a dict for ChatCompletionRequest) that asks what `req` asks, on a
    server with that --reasoning-parser (normalize_billing: not
    --disable-billing-header-normalization)."""
    messages: list[dict] = []
    system = system_text(req.system, normalize_billing)
    if system is not None:
        messages.append({"role": "system", "content": system})
    prior_tool_ids: set[str] = set()
    for i, msg in enumerate(req.messages):
        messages.extend(_convert_message(i, msg, prior_tool_ids))
        prior_tool_ids = (
            {c["id"] for c in messages[-1].get("tool_calls", [])}
            if msg.role == "assistant"
            else set()
        )
    body: dict = {"messages": messages}
    if req.model is not None:
        body["model"] = req.model
    if req.tools:
        body["tools"] = _tools(req.tools)
    body.update(
        _tool_choice(req.tool_choice, [t["function"]["name"] for t in body.get("tools", [])])
    )
    body.update(_thinking(req, reasoning_parser))
    if req.messages[-1].role == "assistant":  # Anthropic's prefill: the answer continues that text
        body["continue_final_message"] = True
    if isinstance(req, MessagesRequest):
        body["max_tokens"] = req.max_tokens
        for src, dst in (
            ("stop_sequences", "stop"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("top_k", "top_k"),
        ):
            if getattr(req, src) is not None:
                body[dst] = getattr(req, src)
        if isinstance((req.metadata or {}).get("user_id"), str):
            body["user"] = req.metadata["user_id"]
        if req.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # the final usage for message_delta
    return body
