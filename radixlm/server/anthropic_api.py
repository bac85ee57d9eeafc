"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

An adapter over the OpenAI chat pipeline: the request becomes a ChatCompletionRequest
(anthropic_protocol.py), chat_pipeline.open_chat runs it, and its body or chunk stream becomes an
Anthropic message or event stream (anthropic_convert.py). Every error, the ones the chat pipeline
raises included, is answered in Anthropic's shape ({"type": "error", "error": {type, message}});
after a stream started, as an `error` event. The key may come as `x-api-key` (http_access.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.engine.tokenizer_manager import EngineDeadError, InternalRequestError
from radixlm.engine.tokenizer_pool import TokenizerTimeout
from radixlm.http_common import anthropic_error
from radixlm.server.anthropic_convert import StreamConverter, error_type, message_from_chat
from radixlm.server.anthropic_protocol import CountTokensRequest, MessagesRequest, chat_body
from radixlm.server.api_common import HTTPError, json_body, parse_body, read_json, srv
from radixlm.server.chat_pipeline import open_chat
from radixlm.server.chat_render import render_chat
from radixlm.server.model_names import requested_model
from radixlm.server.openai_protocol import ChatCompletionRequest, RequestError

logger = logging.getLogger(__name__)
router = APIRouter()


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(
        anthropic_error(error_type(status), message), status_code=status, headers=headers
    )


async def _answer(request: Request, handle):
    """Run a route's handler, answering its errors (and the chat pipeline's) in Anthropic's
    shape."""
    try:
        return await handle()
    except HTTPError as e:
        return _error(e.status, e.message)
    except RequestError as e:
        return _error(400, str(e))
    except EngineDeadError as e:
        return _error(503, str(e))
    except TokenizerTimeout as e:
        return _error(504, str(e))
    except InternalRequestError as e:
        return _error(500, str(e), {"X-Request-Id": e.rid})
    except Exception:  # logged with its trace; the client gets neither trace nor exception text
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return _error(500, "internal server error (see the server log)")


def _chat_request(request: Request, req: CountTokensRequest) -> ChatCompletionRequest:
    args = srv(request).server_args
    body = chat_body(req, args.reasoning_parser, not args.disable_billing_header_normalization)
    return parse_body(ChatCompletionRequest, body)


@router.post("/v1/messages", openapi_extra=json_body(MessagesRequest.model_json_schema()))
async def messages(request: Request):
    async def handle():
        req: MessagesRequest = parse_body(MessagesRequest, await read_json(request))
        stops = req.stop_sequences or []
        result = await open_chat(request, _chat_request(request, req))
        if isinstance(result, dict):
            return JSONResponse(message_from_chat(result, result["model"], stops))
        first = await anext(
            result, None
        )  # open_chat has its first output: this does not wait on the model
        model = first["model"] if first else req.model or ""
        return StreamingResponse(
            _events(request, StreamConverter(model, stops), first, result),
            media_type="text/event-stream",
        )

    return await _answer(request, handle)


def _frame(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def _events(request: Request, conv: StreamConverter, first, chunks: AsyncIterator[dict]):
    """Anthropic's SSE events for the chat chunk stream; an error after the start is an error
    event."""
    try:
        for event in conv.start():
            yield _frame(event)
        chunk = first
        while chunk is not None:
            for event in conv.feed(chunk):
                yield _frame(event)
            chunk = await anext(chunks, None)
        for event in conv.finish():
            yield _frame(event)
    except ValueError as e:
        yield _frame(anthropic_error("invalid_request_error", str(e)))
    except (EngineDeadError, InternalRequestError) as e:
        yield _frame(anthropic_error("api_error", str(e)))
    except Exception:
        logger.exception("internal error in the stream of %s", request.url.path)
        yield _frame(anthropic_error("api_error", "internal server error (see the server log)"))
    finally:
        await chunks.aclose()


@router.post(
    "/v1/messages/count_tokens", openapi_extra=json_body(CountTokensRequest.model_json_schema())
)
async def count_tokens(request: Request):
    """The prompt's tokens as /v1/messages would render it (chat template, system prompt, tools)."""

    async def handle():
        req: CountTokensRequest = parse_body(CountTokensRequest, await read_json(request))
        chat = _chat_request(request, req)
        state = srv(request)
        requested_model(state, chat.model)  # the same model check as /v1/messages
        ids = await state.tokenizer_manager.tokenizer_pool.run(
            render_chat, state, chat, what="rendering the chat template"
        )
        return JSONResponse({"input_tokens": len(ids)})

    return await _answer(request, handle)
