"""Ollama's API requests (/api/chat, /api/generate, /api/show, /api/embed, /api/embeddings) and
their translation into the OpenAI requests radixlm's pipelines run (chat_pipeline.open_chat and
open_completion).

The models accept every field Ollama's own server defines (api/types.go) and refuse others, and
wrong types, with a 400 naming the field (Ollama ignores unknown fields; a typo silently ignored is
what radixlm's other APIs refuse too). `options` likewise: Ollama's option names, typed; the
sampling ones map to radixlm's sampling (temperature, top_p, top_k, min_p, typical_p, num_predict
-> max_tokens, stop, seed, repeat_penalty -> repetition_penalty, presence/frequency_penalty), the
load-time ones and samplers radixlm does not have (mirostat, tfs_z, repeat_last_n, ...) are
accepted and change nothing, as in Ollama's newer engine.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from radixlm.reasoning import get_reasoning_format
from radixlm.server.openai_protocol import RequestError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Options(_Strict):
    """Ollama's `options` (its Modelfile parameters)."""

    # mapped to radixlm's sampling
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    num_predict: int | None = None  # -1 (Ollama's default) and -2: up to the end of the context
    stop: list[str] | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_ctx: int | None = Field(None, ge=1)  # at most the served context (fixed at start-up)
    # accepted, change nothing: load-time settings (the server's flags decide them) and samplers
    # radixlm does not have
    num_keep: int | None = None
    repeat_last_n: int | None = None
    penalize_newline: bool | None = None
    tfs_z: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    draft_num_predict: int | None = None


# Ollama's option -> the OpenAI request's field (and back, to name the option in an error).
SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "stop": "stop",
    "seed": "seed",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "num_predict": "max_tokens",
}
OPTION_OF = {v: k for k, v in SAMPLING.items()}

_FORMAT_DOC = {"anyOf": [{"enum": ["", "json"]}, {"type": "object"}, {"type": "null"}]}
_THINK_DOC = {
    "anyOf": [{"type": "boolean"}, {"enum": ["low", "medium", "high", "max"]}, {"type": "null"}]
}


class _Generation(_Strict):
    model: str = Field(min_length=1)
    stream: bool = True  # Ollama streams unless told not to
    format: Any = Field(None, json_schema_extra=_FORMAT_DOC)
    options: Options | None = None
    keep_alive: float | int | str | None = None  # accepted: the model stays loaded anyway
    think: Any = Field(None, json_schema_extra=_THINK_DOC)
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("format")
    @classmethod
    def _format(cls, v):
        if v is None or v in ("", "json") or isinstance(v, dict):
            return v
        raise ValueError('format must be "json" or a JSON schema (an object)')

    @field_validator("think")
    @classmethod
    def _think(cls, v):
        if v is None or isinstance(v, bool) or v in ("low", "medium", "high", "max"):
            return v
        raise ValueError('think must be a boolean or "low", "medium", "high" or "max"')


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None  # an earlier answer's; not sent back to the model
    images: list[str] | None = None  # base64
    tool_calls: list[dict] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class ChatRequest(_Generation):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict] | None = None


class GenerateRequest(_Generation):
    prompt: str = ""
    suffix: str = ""
    system: str = ""
    template: str = ""
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None
    # image generation models' (experimental in Ollama): accepted unset only
    width: int | None = None
    height: int | None = None
    steps: int | None = None


class ShowRequest(_Strict):
    model: str = Field(min_length=1)
    verbose: bool | None = None
    system: str | None = None  # deprecated in Ollama
    template: str | None = None  # deprecated in Ollama
    options: dict | None = None  # deprecated in Ollama


class EmbedRequest(_Strict):
    model: str = Field(min_length=1)
    input: Any = Field(
        json_schema_extra={
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
        }
    )
    truncate: bool | None = None
    dimensions: int | None = None
    options: Options | None = None
    keep_alive: float | int | str | None = None


class EmbeddingsRequest(_Strict):
    model: str = Field(min_length=1)
    prompt: str = ""
    options: Options | None = None
    keep_alive: float | int | str | None = None


# ------------------------------------------------------------------ translation
def sampling(options: Options | None) -> dict:
    """The OpenAI request's sampling fields for Ollama's options."""
    out: dict = {}
    for name, field in SAMPLING.items():
        value = getattr(options, name, None) if options is not None else None
        if value is None or (name == "num_predict" and value in (-1, -2)):
            continue  # -1: no limit, -2: fill the context; either way up to the context's end
        if name == "num_predict" and value < 0:
            raise RequestError(
                f"options.num_predict must be -1, -2 or at least 0, got {value}",
                "options.num_predict",
            )
        out[field] = value
    return out


def response_format(fmt: Any) -> dict | None:
    """`format` -> the OpenAI response_format: "json" any JSON object, a dict that JSON schema."""
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    return None


def thinking(think: Any, reasoning_parser: str | None, model: str) -> dict:
    """`think` -> the chat request's switch (Qwen3's enable_thinking, ...) and, for a level, the
    reasoning_effort gpt-oss's template reads ("max" is its "high", as Ollama maps it). Unset: the
    server's default (a thinking model thinks, as in Ollama). Thinking needs --reasoning-parser
    (the think block's markers), else it is refused as Ollama refuses a model that cannot think."""
    if think is None or think is False and reasoning_parser is None:
        return {}
    if reasoning_parser is None:
        raise RequestError(
            f'"{model}" does not support thinking (the server has no --reasoning-parser)', "think"
        )
    on = think is not False
    out: dict = {}
    switch = get_reasoning_format(reasoning_parser).switch
    if switch is not None:
        out["chat_template_kwargs"] = {switch: on}
    if isinstance(think, str):
        out["reasoning_effort"] = "high" if think == "max" else think
    return out


def _image_parts(images: list[str] | None) -> list[dict]:
    # Ollama's images are bare base64; the chat pipeline reads data: URLs.
    return [
        {"type": "image_url", "image_url": {"url": f"data:image;base64,{b64}"}}
        for b64 in images or []
    ]


def _content(text: str, images: list[str] | None) -> Any:
    parts = _image_parts(images)
    return [{"type": "text", "text": text}, *parts] if parts else text


def _call_id(i: int, k: int) -> str:
    return f"call_{i}_{k}"


def _tool_calls(i: int, calls: list[dict]) -> list[dict]:
    """An assistant's tool_calls, Ollama's shape (arguments an object) -> OpenAI's (a JSON
    string, with ids the tool messages after it answer)."""
    out = []
    for k, call in enumerate(calls):
        where = f"messages.{i}.tool_calls.{k}"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(
                f"{where}.function: a tool call needs a function with a string name",
                f"{where}.function",
            )
        args = fn.get("arguments", {})
        if not isinstance(args, dict):
            raise RequestError(
                f"{where}.function.arguments: must be an object", f"{where}.function.arguments"
            )
        out.append(
            {
                "id": call.get("id") or _call_id(i, k),
                "type": "function",
                "function": {"name": fn["name"], "arguments": json.dumps(args)},
            }
        )
    return out


def chat_messages(messages: list[Message]) -> list[dict]:
    """Ollama's messages -> OpenAI's. A tool result answers the latest call to its tool_name (or,
    unnamed, the next unanswered call), as Ollama matches them."""
    out: list[dict] = []
    open_calls: list[dict] = []
    for i, m in enumerate(messages):
        if m.role == "tool":
            call = next(
                (c for c in open_calls if m.tool_name in (None, c["function"]["name"])), None
            )
            call_id = m.tool_call_id or (call["id"] if call else _call_id(i, 0))
            if call is not None:
                open_calls.remove(call)
            msg = {"role": "tool", "content": m.content, "tool_call_id": call_id}
            out.append({**msg, "name": m.tool_name} if m.tool_name else msg)
            continue
        msg: dict = {"role": m.role, "content": _content(m.content, m.images)}
        if m.role == "assistant" and m.tool_calls:
            msg["tool_calls"] = _tool_calls(i, m.tool_calls)
            open_calls = list(msg["tool_calls"])
        elif m.images and m.role != "user":
            raise RequestError(
                f"messages.{i}.images: only user messages take images", f"messages.{i}.images"
            )
        out.append(msg)
    return out


def chat_body(
    req: ChatRequest | GenerateRequest,
    messages: list[dict],
    reasoning_parser: str | None,
    model: str,
) -> dict:
    """The OpenAI chat request (a dict for ChatCompletionRequest) for an Ollama chat or templated
    generate request whose messages are already OpenAI's. Always a stream with usage: the routes
    answer whole responses by collecting it, as Ollama's server does."""
    body: dict = {
        "model": model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling(req.options),
        **thinking(req.think, reasoning_parser, req.model),
    }
    rf = response_format(req.format)
    if rf is not None:
        body["response_format"] = rf
    tools = getattr(req, "tools", None)
    if tools:
        body["tools"] = tools
    if req.logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs or 0
    return body
