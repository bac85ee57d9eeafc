"""SGLang's native /generate: the body parsed into a GenerateReqInput (every error a 400 in one
shape), a session's turn when it has session_params (session_api.py), and the answer whole or as
server-sent events."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import TypeAdapter

from radixlm.ipc import GenerateReqInput
from radixlm.sampling_params import SamplingParams
from radixlm.server.api_common import (
    SSE_DONE,
    STREAM_ERRORS,
    HTTPError,
    ServerState,
    json_body,
    observe,
    read_json,
    run_until_disconnect,
    srv,
    sse,
    stream_error_event,
)
from radixlm.server.fanout import admit_to_queue, check_fanout, native_sequences
from radixlm.server.session_api import pop_session_params, session_turn

# SGLang request fields radixlm accepts only at their "off" value (multimodal, LoRA, ...).
_IGNORED_WHEN_EMPTY = {
    "video_data",
    "audio_data",
    "modalities",
    "session_params",
    "custom_logit_processor",
    "return_hidden_states",
    "data_parallel_rank",
    # sent by SGLang's gateway (sglang-router) on every request, off unless a client sets them
    "background",
    "return_bytes",
    "return_entropy",
}
# SGLang request fields accepted at any value and ignored: they change nothing radixlm returns
# (the gateway forwards `model` as null, and SGLang's logging switches, on every request).
_ACCEPTED_AND_IGNORED = {"model", "no_logs", "log_metrics"}
_GENERATE_FIELDS = {f.name for f in dataclasses.fields(GenerateReqInput)}


def _generate_schema() -> dict:
    """/generate's body for the OpenAPI document (what clients and fuzzers read): the route
    parses the body itself, so that every error is a 400 in one shape."""
    sp = TypeAdapter(SamplingParams).json_schema()
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    one_or_list = lambda s: {"anyOf": [s, {"type": "array", "items": s, "minItems": 1}]}
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "text": one_or_list({"type": "string", "minLength": 1}),
            "input_ids": {"anyOf": [ids, {"type": "array", "items": ids, "minItems": 1}]},
            "sampling_params": one_or_list(sp),
            "rid": one_or_list({"type": "string"}),
            "return_logprob": one_or_list({"type": "boolean"}),
            "logprob_start_len": one_or_list({"type": "integer", "minimum": -1}),
            "top_logprobs_num": one_or_list({"type": "integer", "minimum": 0}),
            "return_text_in_logprobs": {"type": "boolean"},
            "stream": {"type": "boolean"},
            "priority": one_or_list({"type": "integer"}),
            "cache_salt": one_or_list({"type": "string", "minLength": 1, "maxLength": 1024}),
            "lora_path": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "null"},
                    {"type": "array", "items": {"type": ["string", "null"]}, "minItems": 1},
                ]
            },
            "session_params": {"type": "object"},  # session_api.py
            # SGLang's: images (data: URL, base64, file://, allowed http(s)), one or a list per
            # prompt.
            "image_data": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "null"},
                    {
                        "type": "array",
                        "items": {
                            "anyOf": [
                                {"type": "string"},
                                {"type": "null"},
                                {"type": "array", "items": {"type": "string"}},
                            ]
                        },
                    },
                ]
            },
            # PD disaggregation (docs/disaggregation.md): set by `radixlm router
            # --pd-disaggregation`.
            "bootstrap_host": one_or_list({"type": "string"}),
            "bootstrap_port": one_or_list({"type": "integer"}),
            "bootstrap_room": one_or_list({"type": "integer"}),
        },
        # Exactly one of text and input_ids.
        "oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}],
    }


def parse_generate_body(body: Any) -> GenerateReqInput:
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    known = _GENERATE_FIELDS | _IGNORED_WHEN_EMPTY | _ACCEPTED_AND_IGNORED
    unknown = sorted(k for k in body if k not in known)
    unsupported = sorted(
        k for k in body if k in _IGNORED_WHEN_EMPTY and body[k] not in (None, False, [], {}, "")
    )
    if unknown:
        raise HTTPError(400, f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    if unsupported:
        raise HTTPError(
            400, f"unsupported field(s): {', '.join(unsupported)}", param=unsupported[0]
        )
    kw = {k: v for k, v in body.items() if k in _GENERATE_FIELDS}
    if "text" in kw and "input_ids" in kw and kw["input_ids"] is None:
        kw.pop("input_ids")
    try:
        return GenerateReqInput(**kw)
    except (TypeError, ValueError) as e:
        raise HTTPError(400, str(e)) from None


router = APIRouter()


@router.api_route("/generate", methods=["POST", "PUT"], openapi_extra=json_body(_generate_schema()))
async def generate(request: Request):
    state = srv(request)
    body = await read_json(request)
    session = pop_session_params(body)  # a session's turn: session_api.py
    obj = parse_generate_body(body)
    check_fanout(
        state,
        native_sequences(obj),
        obj.batch_size,
        "text" if obj.text is not None else "input_ids",
    )
    gen = (
        await session_turn(request, obj, session, admit_to_queue(state))
        if session is not None
        else state.tokenizer_manager.generate_request(obj, admit=admit_to_queue(state))
    )
    if obj.stream:
        return StreamingResponse(_stream_native(state, gen), media_type="text/event-stream")

    async def collect():
        out = None
        async for out in gen:  # noqa: B007 (the last item is the result)
            pass
        return out

    try:
        out = await run_until_disconnect(request, collect())
    except ValueError as e:
        raise HTTPError(400, str(e)) from None
    observe(state, out)
    return JSONResponse(out)


async def _stream_native(state: ServerState, gen: AsyncIterator):
    incremental = state.server_args.incremental_streaming_output
    sent: dict[int, tuple[int, int]] = {}
    try:
        async for out in gen:
            if incremental:
                idx = out.get("index", 0)
                nt, ni = sent.get(idx, (0, 0))
                text, ids = out["text"], out["output_ids"]
                sent[idx] = (len(text), len(ids))
                out = {**out, "text": text[nt:], "output_ids": ids[ni:]}
            if out["meta_info"].get("finish_reason") is not None:
                observe(state, out)
            yield sse(out)
    except STREAM_ERRORS as e:
        yield stream_error_event(e)
    yield SSE_DONE
