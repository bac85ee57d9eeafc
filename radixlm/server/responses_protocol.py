"""OpenAI's Responses API request (POST /v1/responses), translated into the chat pipeline's
ChatCompletionRequest: input items become chat messages, Responses tools and tool_choice become
chat's, text.format becomes response_format, reasoning.effort a chat-template variable.

The model is strict like the chat one (an unknown field is a 400 naming it); fields OpenAI defines
that radixlm cannot honour (background, truncation "auto", hosted tools, image/file inputs) are
refused by name rather than ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixlm.server import responses_custom_tools as custom_tools
from radixlm.server.openai_protocol import ExtraSamplers, RequestError, SGLangExtras, StreamOptions

# Content part types that carry text, by the role they may appear in.
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: str | None = None  # accepted; no summaries are generated
    generate_summary: str | None = None


class TextConfig(_Strict):
    format: dict | None = None
    verbosity: str | None = None  # accepted; a hint with no effect here


class ResponsesRequest(SGLangExtras, ExtraSamplers):
    model: str | None = None
    input: Any = Field(
        json_schema_extra={
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]
        }
    )
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    reasoning: Reasoning | None = None
    store: bool | None = True
    previous_response_id: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    background: bool | None = False
    truncation: Literal["disabled", "auto"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None  # accepted: the radix cache finds shared prefixes by itself
    safety_identifier: str | None = None
    seed: int | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)


def check_supported(req: ResponsesRequest) -> None:
    """Refuse, by name, what OpenAI defines and radixlm does not do."""
    if req.background:
        raise RequestError(
            "background responses are not supported (background must be false)", "background"
        )
    if req.truncation == "auto":
        raise RequestError(
            "truncation 'auto' is not supported: a prompt longer than the context is a 400",
            "truncation",
        )
    # Codex asks for reasoning.encrypted_content on every request to a reasoning model, to resend
    # the reasoning items later: accepted, the items come back as they are (their text in the
    # clear, no encrypted_content) and reasoning items in the input are dropped anyway.
    for value in req.include or []:
        if value != "reasoning.encrypted_content":
            raise RequestError(
                f"include {value!r} is not supported (only reasoning.encrypted_content, which"
                " changes nothing: no output logprobs or other extras)",
                "include",
            )


# ------------------------------------------------------------------ tools
def chat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Responses' flat function tools ({type, name, parameters, strict}) as chat's nested ones;
    custom (free-form) tools as functions of one string (responses_custom_tools.py)."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if isinstance(t, dict) and t.get("type") == "custom":
            out.append(custom_tools.function_tool(t, i))
            continue
        if not isinstance(t, dict) or t.get("type") != "function":
            got = t.get("type") if isinstance(t, dict) else t
            raise RequestError(
                f"tools[{i}]: only function and custom tools are supported, got type {got!r}",
                f"tools.{i}.type",
            )
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise RequestError(f"tools[{i}] needs a string name", f"tools.{i}.name")
        fn = {"name": t["name"]}
        for k in ("description", "parameters", "strict"):
            if t.get(k) is not None:
                fn[k] = t[k]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    """none | auto | required as they are; {type: function, name} as chat's {type, function:
    {name}}."""
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    custom = custom_tools.tool_choice(choice)
    if custom is not None:
        return custom
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise RequestError(
        "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\" | \"custom\","
        ' "name": ...}',
        "tool_choice",
    )


def response_format(text: TextConfig | None) -> dict | None:
    """text.format ({type: text | json_object | json_schema, name, schema, strict}) as chat's
    response_format."""
    fmt = text.format if text is not None else None
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise RequestError(
                "text.format of type json_schema needs a schema object", "text.format.schema"
            )
        spec = {
            k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None
        }
        return {"type": "json_schema", "json_schema": spec}
    raise RequestError(
        f"text.format.type must be text, json_object or json_schema, got {kind!r}",
        "text.format.type",
    )


# ------------------------------------------------------------------ input items
def _text(content: Any, where: str) -> str:
    """A message's content: a string, or text parts joined with newlines (as the chat route joins
    them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise RequestError(
                f"{where}[{j}]: content part type {kind!r} is not supported (text only)",
                f"{where}.{j}.type",
            )
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise RequestError(f"{where}[{j}] needs a string field text", f"{where}.{j}.text")
        texts.append(text)
    return "\n".join(texts)


def chat_messages(items: Any, history: list[dict]) -> list[dict]:
    """Input items (after `history`, the stored conversation of previous_response_id) as chat
    messages: messages by role, consecutive function_call items as one assistant message with
    tool_calls (joined to the assistant message just before them; custom_tool_call items alike),
    function_call_output (and custom_tool_call_output) items as tool messages. Reasoning items are
    dropped: templates render no earlier turn's thinking."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError("input must be a string or a list of input items", "input")
    out: list[dict] = []
    calls = {c["id"] for m in history for c in m.get("tool_calls") or []}
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(
                    f"{where}.role must be user, assistant, system or developer, got {role!r}",
                    f"{where}.role",
                )
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text(item.get("content"), f"{where}.content"),
                }
            )
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "custom_tool_call":
                call = custom_tools.input_call(item, where)
            else:
                for k in ("call_id", "name", "arguments"):
                    if not isinstance(item.get(k), str):
                        raise RequestError(
                            f"{where} (function_call) needs a string {k}", f"{where}.{k}"
                        )
                call = {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            calls.add(item["call_id"])
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where} ({kind}) needs a string call_id", f"{where}.call_id")
            if item["call_id"] not in calls:
                raise RequestError(
                    f"{where}.call_id {item['call_id']!r} answers no earlier function_call",
                    f"{where}.call_id",
                )
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": _text(item.get("output"), f"{where}.output"),
                }
            )
        elif kind != "reasoning":
            raise RequestError(
                f"{where}: input item type {kind!r} is not supported (message, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output, reasoning)",
                f"{where}.type",
            )
    return out


def chat_request_body(req: ResponsesRequest, history: list[dict]) -> tuple[dict, list[dict]]:
    """(the ChatCompletionRequest body, the conversation without instructions). The instructions
    come first and are not kept with the conversation: a continued response takes its own (as
    OpenAI defines it), so the same instructions re-render the same prefix."""
    check_supported(req)
    conversation = [*history, *chat_messages(req.input, history)]
    if not conversation:
        raise RequestError("input has no items", "input")
    system = (
        [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    )
    body: dict[str, Any] = {"messages": system + conversation, "stream": bool(req.stream)}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    extras = req.model_dump(
        include=set(SGLangExtras.model_fields) | set(ExtraSamplers.model_fields), exclude_none=True
    )
    body.update(extras)
    for k in ("model", "temperature", "top_p", "parallel_tool_calls", "user", "seed", "cache_salt"):
        if getattr(req, k) is not None:
            body[k] = getattr(req, k)
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    if req.tools is not None:
        body["tools"] = chat_tools(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = chat_tool_choice(req.tool_choice)
    rf = response_format(req.text)
    if rf is not None:
        body["response_format"] = rf
    if req.reasoning is not None and req.reasoning.effort is not None:
        # As SGLang and vLLM pass it: templates that know reasoning_effort read it, others ignore
        # it.
        body["chat_template_kwargs"] = {"reasoning_effort": req.reasoning.effort}
    return body, conversation
