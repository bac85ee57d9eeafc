"""OpenAI request models (/v1/completions, /v1/chat/completions) and the logprob formats.

Models are strict and forbid unknown fields, so a typo'd or wrongly typed field is a 400 that
names it instead of being silently ignored or coerced (OpenAI itself rejects unknown fields).
Known OpenAI fields radixlm cannot honour are accepted at their "off" value and refused otherwise.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_TOP_LOGPROBS = 20
# A JSON-schema string that allows any object: what response_format json_object constrains to.
ANY_JSON_OBJECT = '{"type": "object"}'

# What the free-form (Any) fields below accept, for the OpenAPI document (their validators check
# it).
_STR = {"type": "string"}
_STRS = {"type": "array", "items": _STR}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_NULL = {"type": "null"}


def _doc(*alternatives: dict):
    return Field(None, json_schema_extra={"anyOf": [*alternatives, _NULL]})


class RequestError(ValueError):
    """A bad request field; `param` names it (OpenAI's error.param)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # newer clients send it; nothing to obfuscate here


class JsonSchemaSpec(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaSpec | None = None
    # type structural_tag, SGLang's form: free text until a trigger, then begin + JSON by the schema
    # + end.
    structures: list[dict] | None = None
    triggers: list[str] | None = None
    format: dict | None = None  # or xgrammar's own structural-tag format


class ChatMessage(BaseModel):
    # Lenient about extra keys: clients often send back a whole previous response message
    # (refusal, annotations, audio, ...); only the fields below reach the chat template.
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Any = _doc(
        _STR,
        {
            "type": "array",
            "items": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"type": {"const": "text"}, "text": _STR},
                        "required": ["type", "text"],
                    },
                    {
                        "type": "object",
                        "properties": {
                            "type": {"const": "image_url"},
                            "image_url": {
                                "type": "object",
                                "properties": {"url": _STR, "detail": _STR},
                                "required": ["url"],
                            },
                        },
                        "required": ["type", "image_url"],
                    },
                ]
            },
        },
    )
    name: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, v):
        if v is None or isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("content must be a string or a list of content parts")
        for part in v:
            if not isinstance(part, dict) or "type" not in part:
                raise ValueError('each content part must be an object with a "type"')
            if (
                part["type"] == "image_url"
            ):  # OpenAI's image part: {"image_url": {"url": ..., "detail": ...}}
                img = part.get("image_url")
                if (
                    not isinstance(img, dict)
                    or not isinstance(img.get("url"), str)
                    or not img["url"]
                ):
                    raise ValueError(
                        'an "image_url" content part needs an object "image_url" with a string'
                        ' "url"'
                    )
                continue
            if part["type"] != "text":
                raise ValueError(
                    f"content part type {part['type']!r} is not supported (text, image_url)"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError('a "text" content part needs a string field "text"')
        return v

    def image_urls(self) -> list[str]:
        if not isinstance(self.content, list):
            return []
        return [p["image_url"]["url"] for p in self.content if p["type"] == "image_url"]

    def for_template(self) -> dict:
        content = self.content
        if (
            isinstance(content, list) and self.image_urls()
        ):  # HF templates' parts: {"type": "image"} where each goes
            content = [{"type": "image"} if p["type"] == "image_url" else p for p in content]
        elif isinstance(content, list):  # parts are joined with newlines, as vLLM does
            content = "\n".join(p["text"] for p in content)
        # "developer" is OpenAI's newer name for "system"; templates know only the latter.
        m = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        for k in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, k) is not None:
                m[k] = getattr(self, k)
        return m


class SGLangExtras(_Strict):
    """SGLang's extra sampling fields, sent by clients through `extra_body`."""

    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    regex: str | None = None
    json_schema: Any | None = _doc(_STR, {"type": "object"})  # a JSON-schema string (or object)
    ebnf: str | None = None
    structural_tag: Any | None = _doc(_STR, {"type": "object"})
    stop_regex: Any = _doc(_STR, _STRS)  # a regex string or a list of them


class ExtraSamplers(_Strict):
    """vLLM's and llama-server's extra sampling fields (docs/sampling.md), also through
    `extra_body`."""

    typical_p: float | None = None
    bad_words: Any = _doc(_STR, _STRS)  # words the output may not contain
    allowed_token_ids: list[int] | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None


class _Common(SGLangExtras, ExtraSamplers):
    model: str | None = None  # optional here; when given it must name the served model
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Any = _doc(_STR, _STRS)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    user: str | None = None
    # vLLM's: requests share cached prompt KV only with requests of the same salt (a tenant's own).
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    # vLLM's: the prompt's token ids (prompt_token_ids) and each choice's (token_ids) in the answer.
    return_token_ids: bool | None = None
    # SGLang's PD disaggregation fields (docs/disaggregation.md), set by `radixlm router
    # --pd-disaggregation`.
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    # SGLang's, sent by its gateway (sglang-router) on every request: accepted off only.
    return_hidden_states: bool | None = None

    @field_validator("return_hidden_states")
    @classmethod
    def _no_hidden_states(cls, v):
        if v:
            raise ValueError("return_hidden_states is not supported (only false)")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        for k, b in (v or {}).items():
            if not str(k).isdigit():
                raise ValueError(f"keys must be token ids, got {k!r}")
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not -100 <= b <= 100:
                raise ValueError(f"biases must be numbers in [-100, 100], got {b!r} for {k!r}")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if (
            v is None
            or isinstance(v, str)
            or (isinstance(v, list) and all(isinstance(s, str) for s in v))
        ):
            return v or None  # [] and "" mean no stop
        raise ValueError("stop must be a string or a list of strings")

    @field_validator("json_schema")
    @classmethod
    def _schema_str(cls, v):
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, dict):
            return json.dumps(v)
        raise ValueError("json_schema must be a JSON-schema string or object")


class CompletionRequest(_Common):
    prompt: Any = Field(
        json_schema_extra={
            "anyOf": [
                {**_STR, "minLength": 1},
                {**_STRS, "minItems": 1},
                _IDS,
                {"type": "array", "items": _IDS, "minItems": 1},
            ]
        }
    )
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        def ids(x):
            return (
                isinstance(x, list)
                and bool(x)
                and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
            )

        if isinstance(v, str) or ids(v):
            return v
        if (
            isinstance(v, list)
            and v
            and (all(isinstance(p, str) for p in v) or all(ids(p) for p in v))
        ):
            return v
        raise ValueError(
            "prompt must be a string, a list of strings, a list of token ids or a list of such"
            " lists"
        )


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict | None = None
    # SGLang's: false keeps the think block in content (--reasoning-parser); OpenAI's effort
    # switches Mistral's.
    separate_reasoning: bool | None = None
    # SGLang's (its gateway sends true): reasoning_content streams as it is generated; false (all of
    # it in one chunk) is not supported.
    stream_reasoning: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # The last message continued (no end of turn; HF's continue_final_message), or a new assistant
    # turn opened (add_generation_prompt; default: unless continuing), as vLLM and SGLang name them.
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    # A thinking budget (server/thinking_params.py): the issue's, SGLang's and vLLM's spellings.
    max_thinking_tokens: int | None = Field(None, ge=0)
    thinking_budget: int | None = Field(None, ge=0)
    thinking_token_budget: int | None = Field(None, ge=0)
    parallel_tool_calls: bool | None = None  # false: one call at most (docs/agents.md)
    # Accepted and ignored: they change nothing about generation.
    store: bool | None = None
    metadata: dict | None = None
    service_tier: str | None = None

    @field_validator("stream_reasoning")
    @classmethod
    def _streamed_reasoning(cls, v):
        if v is False:
            raise ValueError("stream_reasoning false is not supported (reasoning streams as made)")
        return v


def parse_request(cls: type[BaseModel], body: Any):
    """Validate a JSON body into `cls`, turning pydantic's errors into one RequestError."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return cls.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            raise RequestError(
                f"unknown field '{loc}' (unrecognized request argument)", loc
            ) from None
        if err["type"] == "missing":
            raise RequestError(f"missing required field '{loc}'", loc) from None
        msg = err["msg"].removeprefix("Value error, ")
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        raise RequestError(f"invalid value for '{loc}': {msg} (got {got})", loc) from None


def response_format_constraint(rf: ResponseFormat | None) -> tuple[str, str] | None:
    """(sampling_params field, value) a response_format asks for: json_schema or structural_tag
    (None: free text). Structured generation enforces it; this is the one place the mapping lives.
    """
    if rf is None or rf.type == "text":
        return None
    if rf.type == "structural_tag":
        if rf.format is not None:
            return "structural_tag", json.dumps({"type": "structural_tag", "format": rf.format})
        if rf.structures is None or rf.triggers is None:
            raise RequestError(
                "response_format of type structural_tag needs structures and triggers (or format)",
                "response_format.structures",
            )
        return "structural_tag", json.dumps({"structures": rf.structures, "triggers": rf.triggers})
    return "json_schema", _json_schema(rf)


def _json_schema(rf: ResponseFormat) -> str:
    if rf.type == "json_object":
        return ANY_JSON_OBJECT
    if rf.json_schema is None:
        raise RequestError(
            "response_format of type json_schema needs a json_schema object",
            "response_format.json_schema",
        )
    if rf.json_schema.schema_ is None:
        return ANY_JSON_OBJECT
    return json.dumps(rf.json_schema.schema_)


# ------------------------------------------------------------------ logprob formats
def _lp(x: float | None) -> float | None:
    # -inf is not valid JSON; clamp like vLLM does.
    return None if x is None else max(float(x), -9999.0)


def completion_logprobs(tokens: list, tops: list, offset: int) -> tuple[dict, int]:
    """OpenAI's legacy format for (logprob, id, text) entries; `tops` per position is a list of
    such entries (or None). text_offset counts from `offset`; returns the next offset too."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for k, (lp, _tid, text) in enumerate(tokens):
        top = tops[k] if k < len(tops) else None
        text = text or ""
        out["tokens"].append(text)
        out["token_logprobs"].append(_lp(lp))
        if lp is None and not top:  # the first prompt token has no logprob at all
            out["top_logprobs"].append(None)
        else:
            d = {(t or ""): _lp(v) for v, _i, t in top or []}
            if lp is not None:
                d.setdefault(text, _lp(lp))  # the sampled token is always listed
            out["top_logprobs"].append(d)
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


def chat_logprobs(tokens: list, tops: list) -> list[dict]:
    """The chat format: one {token, logprob, bytes, top_logprobs} per generated token."""

    def entry(lp, text):
        text = text or ""
        return {"token": text, "logprob": _lp(lp), "bytes": list(text.encode("utf-8"))}

    return [
        {
            **entry(lp, text),
            "top_logprobs": [
                entry(v, t) for v, _i, t in (tops[k] if k < len(tops) else None) or []
            ],
        }
        for k, (lp, _tid, text) in enumerate(tokens)
    ]
