"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, and
POST /v1/responses/{id}/cancel (as vLLM and SGLang serve them).

An adapter over the chat pipeline: the request (after the stored conversation of its
previous_response_id) becomes a ChatCompletionRequest (responses_protocol.py), `open_chat` runs it,
and its body or chunks become a Response or Responses' streaming events (responses_output.py).
A continued conversation renders its earlier turns exactly as before, so the radix cache serves
them (usage.input_tokens_details.cached_tokens). Stored responses: responses_store.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.engine.tokenizer_manager import EngineDeadError, InternalRequestError
from radixlm.server.api_common import HTTPError, json_body, parse_body, read_json, srv
from radixlm.server.chat_pipeline import open_chat
from radixlm.server.openai_protocol import ChatCompletionRequest, RequestError
from radixlm.server.responses_output import (
    EventStream,
    Shell,
    assistant_message,
    echo_fields,
    new_id,
    response_body,
)
from radixlm.server.responses_protocol import ResponsesRequest, chat_request_body
from radixlm.server.responses_store import ResponseStore, StoredResponse
from radixlm.server.session_api import owner

router = APIRouter()

# The chat pipeline's names for the fields it reports, as this API calls them.
_PARAMS = (
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


def store_of(request: Request) -> ResponseStore:
    store = getattr(request.app.state, "responses_store", None)
    if store is None:
        args = srv(request).server_args
        store = request.app.state.responses_store = ResponseStore(
            args.max_stored_responses, args.stored_response_ttl
        )
    return store


def _renamed(e: HTTPError) -> HTTPError:
    msg, param = e.message, e.param
    for chat, ours in _PARAMS:
        msg = msg.replace(chat, ours)
        if param is not None and param.split(".")[0] == chat:
            param = ours + param[len(chat) :]
    if param is not None and param.startswith("tools.") and ".function." in param:
        param = param.replace(".function.", ".", 1)  # chat's nested tools are flat here
    return HTTPError(e.status, msg, e.kind, param)


def _not_found(rid: str, param: str | None = None) -> HTTPError:
    return HTTPError(
        404,
        f"no stored response with id '{rid}' (never stored, deleted, expired, or stored under "
        "another API key)",
        "not_found_error",
        param,
    )


@router.post("/v1/responses", openapi_extra=json_body(ResponsesRequest.model_json_schema()))
async def create_response(request: Request):
    req: ResponsesRequest = parse_body(ResponsesRequest, await read_json(request))
    key, store = owner(request), store_of(request)
    history: list[dict] = []
    if req.previous_response_id is not None:
        prev = store.get(req.previous_response_id, key)
        if prev is None:
            raise _not_found(req.previous_response_id, "previous_response_id")
        history = prev.conversation
    try:
        body, conversation = chat_request_body(req, history)
    except RequestError as e:
        raise HTTPError(400, str(e), param=e.param) from None
    try:
        chat = await open_chat(request, parse_body(ChatCompletionRequest, body))
    except HTTPError as e:
        raise _renamed(e) from None
    shell = Shell(new_id("resp"), "", echo_fields(req, req.tools, req.tool_choice))

    def keep(final: dict) -> None:
        if req.store:
            store.put(
                shell.id,
                StoredResponse(key, final, [*conversation, assistant_message(final["output"])]),
            )

    if isinstance(chat, dict):
        shell.model = chat["model"]
        final = response_body(shell, chat)
        keep(final)
        return JSONResponse(final)
    return StreamingResponse(_sse(_events(shell, chat, keep)), media_type="text/event-stream")


async def _events(
    shell: Shell, chunks: AsyncIterator[dict], keep: Callable[[dict], None]
) -> AsyncIterator[dict]:
    es = EventStream(shell)
    started = False
    try:
        async for chunk in chunks:
            if not started:  # the first chunk names the model the Response reports
                shell.model, started = chunk.get("model", ""), True
                for ev in es.start():
                    yield ev
            for ev in es.chunk(chunk):
                yield ev
    except (ValueError, EngineDeadError, InternalRequestError) as e:
        status = (
            400 if isinstance(e, ValueError) else 503 if isinstance(e, EngineDeadError) else 500
        )
        for ev in ([] if started else es.start()) + list(es.failed(status, str(e))):
            yield ev
        return
    finally:
        await chunks.aclose()
    for ev in es.finish():
        yield ev
    keep(es.final)


async def _sse(events: AsyncIterator[dict]):
    """Responses' SSE framing: each event named by its type (no [DONE] line, as OpenAI)."""
    async for ev in events:
        yield f"event: {ev['type']}\ndata: {json.dumps(ev, ensure_ascii=False)}\n\n".encode()


@router.get("/v1/responses/{response_id}")
async def retrieve_response(request: Request, response_id: str):
    item = store_of(request).get(response_id, owner(request))
    if item is None:
        raise _not_found(response_id)
    return JSONResponse(item.body)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str):
    if not store_of(request).delete(response_id, owner(request)):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str):
    """Only background responses can be cancelled (OpenAI, vLLM); this server runs none, so a
    stored response is already finished: a 400, as vLLM answers for a synchronous one."""
    item = store_of(request).get(response_id, owner(request))
    if item is None:
        raise _not_found(response_id)
    raise HTTPError(
        400,
        f"response '{response_id}' is {item.body['status']}: only background responses can be "
        "cancelled, and this server runs none (background: false)",
        param="response_id",
    )
