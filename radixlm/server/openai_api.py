"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Each request runs through the pipelines of chat_pipeline.py (one native GenerateReqInput for the
TokenizerManager; its response dicts reshaped into OpenAI's objects and SSE chunks), which the other
APIs' routes share. Request models and the logprob formats live in openai_protocol.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.server.api_common import (
    SSE_DONE,
    STREAM_ERRORS,
    HTTPError,
    ServerState,
    json_body,
    parse_body,
    read_json,
    served_model_name,
    srv,
    sse,
    stream_error_event,
)
from radixlm.server.chat_pipeline import open_chat, open_completion
from radixlm.server.lora_api import lora_model_cards
from radixlm.server.model_names import known_model_names
from radixlm.server.openai_protocol import ChatCompletionRequest, CompletionRequest

router = APIRouter()


def _model_card(state: ServerState) -> dict:
    info = state.scheduler_info
    return {
        "id": served_model_name(state.server_args, info),
        "object": "model",
        "created": state.started_at,
        "owned_by": "radixlm",
        "root": info["model_path"],
        "parent": None,
        "max_model_len": info["context_len"],
        "modalities": info.get(
            "modalities", ["text"]
        ),  # what the model takes in: text, and image for a vision model
    }


def _check_model(state: ServerState, name: str | None) -> str:
    served = served_model_name(state.server_args, state.scheduler_info)
    if name is not None and name not in known_model_names(state):
        raise HTTPError(
            404,
            f"The model '{name}' does not exist; this server serves '{served}'.",
            "not_found_error",
            "model",
        )
    return served


@router.get("/v1/models")
async def list_models(request: Request):
    state = srv(request)
    base = _model_card(state)
    return {"object": "list", "data": [base, *lora_model_cards(state, base)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str):
    state = srv(request)
    _check_model(state, model_id)
    return _model_card(state)


def _respond(result):
    """A body (JSON) or a chunk iterator (SSE), as open_chat and open_completion return them."""
    if isinstance(result, dict):
        return JSONResponse(result)
    return StreamingResponse(_sse(result), media_type="text/event-stream")


async def _sse(chunks: AsyncIterator[dict]):
    """OpenAI's SSE framing of a chunk iterator; an error after the start is an error event."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
    except STREAM_ERRORS as e:
        yield stream_error_event(e)
    finally:
        await chunks.aclose()
    yield SSE_DONE


# ------------------------------------------------------------ completions
@router.post("/v1/completions", openapi_extra=json_body(CompletionRequest.model_json_schema()))
async def completions(request: Request):
    req: CompletionRequest = parse_body(CompletionRequest, await read_json(request))
    return _respond(await open_completion(request, req))


# -------------------------------------------------------- chat completions
@router.post(
    "/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest.model_json_schema())
)
async def chat_completions(request: Request):
    req: ChatCompletionRequest = parse_body(ChatCompletionRequest, await read_json(request))
    return _respond(await open_chat(request, req))
