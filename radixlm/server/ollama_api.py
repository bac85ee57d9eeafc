"""Ollama's API: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show,
/api/ps, /api/version (docs/openai_api.md, "Ollama's API").

An adapter over the OpenAI pipelines, as anthropic_api.py is: /api/chat and templated
/api/generate become a ChatCompletionRequest for chat_pipeline.open_chat (a generate prompt as one
user message after its `system`, `context` ids before the rendered prompt); raw and
fill-in-the-middle (`suffix`) generate become a completions request on the prompt's token ids for
chat_pipeline.open_completion. Both always run as streams, which ollama_convert.py turns into
Ollama's NDJSON objects, or collects into one answer for stream false (as Ollama's server does).
Every error is Ollama's {"error": "..."}; after a stream started, as an object of the stream.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from radixlm.engine.tokenizer_manager import EngineDeadError, InternalRequestError
from radixlm.engine.tokenizer_pool import TokenizerTimeout
from radixlm.server.api_common import (
    STREAM_ERRORS,
    HTTPError,
    ServerState,
    json_body,
    parse_body,
    read_json,
    run_until_disconnect,
    srv,
)
from radixlm.server.chat_pipeline import open_chat, open_completion
from radixlm.server.embedding_api import encode_inputs
from radixlm.server.fim import fim_prompt_ids
from radixlm.server.ollama_convert import OllamaStream, collect, now_iso
from radixlm.server.ollama_models import resolve_model, running, show, tags
from radixlm.server.ollama_protocol import (
    OPTION_OF,
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    Options,
    ShowRequest,
    chat_body,
    chat_messages,
    sampling,
)
from radixlm.server.openai_protocol import (
    ANY_JSON_OBJECT,
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
)
from radixlm.version import __version__

logger = logging.getLogger(__name__)
router = APIRouter()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _named_as_sent(e: HTTPError) -> str:
    """The pipelines name OpenAI's fields (max_tokens, repetition_penalty, ...): an error about one
    an Ollama option set names that option."""
    option = OPTION_OF.get(e.param or "")
    if option is None or not e.message.startswith(e.param):
        return e.message
    return f"options.{option}" + e.message[len(e.param) :]


async def _answer(request: Request, handle):
    """Run a route's handler, answering its errors (and the pipelines') in Ollama's shape."""
    try:
        return await handle()
    except HTTPError as e:
        return _error(e.status, _named_as_sent(e))
    except RequestError as e:
        return _error(400, str(e))
    except EngineDeadError as e:
        return _error(503, str(e))
    except TokenizerTimeout as e:
        return _error(504, str(e))
    except InternalRequestError as e:
        response = _error(500, str(e))
        response.headers["X-Request-Id"] = e.rid
        return response
    except Exception:  # logged with its trace; the client gets neither trace nor exception text
        logger.exception("internal error on %s %s", request.method, request.url.path)
        return _error(500, "internal server error (see the server log)")


def _check_options(state: ServerState, options: Options | None) -> None:
    n = options.num_ctx if options is not None else None
    if n is not None and n > state.context_len:
        raise HTTPError(
            400,
            f"options.num_ctx {n} is more than this model's context length {state.context_len} "
            "(the server's --context-length)",
            param="options.num_ctx",
        )


def _check_images(state: ServerState, field: str) -> None:
    if "image" not in state.scheduler_info.get("modalities", ["text"]):
        raise HTTPError(400, f"{field}: the served model takes text only (no images)", param=field)


def _loaded(req, chat: bool) -> JSONResponse:
    """Ollama's answer to a request with nothing to generate: it loads (or, keep_alive 0, unloads)
    the model. Here it is always loaded; the answer says what was asked."""
    reason = "unload" if req.keep_alive in (0, "0", "0s", "0m") else "load"
    body = {"model": req.model, "created_at": now_iso(), "done": True, "done_reason": reason}
    body.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return JSONResponse(body)


def _line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


async def _objects(conv: OllamaStream, chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
    try:
        async for chunk in chunks:
            for obj in conv.feed(chunk):
                yield obj
        yield conv.final()
    finally:
        await chunks.aclose()


async def _ndjson(request: Request, objects: AsyncIterator[dict]):
    """Ollama's stream: one JSON object a line; an error after the start is an error object."""
    try:
        async for obj in objects:
            yield _line(obj)
    except STREAM_ERRORS as e:
        yield _line({"error": e.message if isinstance(e, HTTPError) else str(e)})
    except Exception:
        logger.exception("internal error in the stream of %s", request.url.path)
        yield _line({"error": "internal server error (see the server log)"})


async def _reply(request: Request, stream: bool, conv: OllamaStream, chunks):
    objects = _objects(conv, chunks)
    if stream:
        return StreamingResponse(_ndjson(request, objects), media_type="application/x-ndjson")

    async def gather() -> list[dict]:
        return [obj async for obj in objects]

    return JSONResponse(collect(await run_until_disconnect(request, gather())))


def _chat_request(body: dict) -> ChatCompletionRequest:
    return parse_body(ChatCompletionRequest, body)


@router.post("/api/chat", openapi_extra=json_body(ChatRequest.model_json_schema()))
async def chat(request: Request):
    async def handle():
        started = time.perf_counter_ns()
        req: ChatRequest = parse_body(ChatRequest, await read_json(request))
        state = srv(request)
        model = resolve_model(state, req.model)
        _check_options(state, req.options)
        if not req.messages:
            return _loaded(req, chat=True)
        for i, m in enumerate(req.messages):
            if m.images:
                _check_images(state, f"messages.{i}.images")
        parser = state.server_args.reasoning_parser
        body = chat_body(req, chat_messages(req.messages), parser, model)
        chunks = await open_chat(request, _chat_request(body))
        return await _reply(request, req.stream, OllamaStream(req.model, True, started), chunks)

    return await _answer(request, handle)


@router.post("/api/generate", openapi_extra=json_body(GenerateRequest.model_json_schema()))
async def generate(request: Request):
    async def handle():
        started = time.perf_counter_ns()
        req: GenerateRequest = parse_body(GenerateRequest, await read_json(request))
        state = srv(request)
        model = resolve_model(state, req.model)
        _check_options(state, req.options)
        _check_generate(state, req)
        if not req.prompt and not req.suffix:
            return _loaded(req, chat=False)
        if req.raw or req.suffix:
            chunks = await open_completion(request, await _completion_request(state, req, model))
            conv = OllamaStream(req.model, False, started)
        else:
            user = {"role": "user", "content": req.prompt}
            if req.images:
                user["content"] = [
                    {"type": "text", "text": req.prompt},
                    *[
                        {"type": "image_url", "image_url": {"url": f"data:image;base64,{b}"}}
                        for b in req.images
                    ],
                ]
            system = [{"role": "system", "content": req.system}] if req.system else []
            body = chat_body(req, [*system, user], state.server_args.reasoning_parser, model)
            chunks = await open_chat(
                request, _chat_request(body), prompt_prefix=req.context, token_ids=True
            )
            conv = OllamaStream(req.model, False, started, context=True)
        return await _reply(request, req.stream, conv, chunks)

    return await _answer(request, handle)


def _check_generate(state: ServerState, req: GenerateRequest) -> None:
    """What /api/generate refuses before any work (Ollama's own refusals first)."""
    if req.raw and (req.template or req.system or req.context):
        raise HTTPError(400, "raw mode does not support template, system, or context", param="raw")
    if req.template:
        raise HTTPError(
            400,
            "template: radixlm renders the model's own chat template (Jinja); Ollama's Go "
            "templates are not supported (send raw with the prompt formatted instead)",
            param="template",
        )
    if any(v is not None for v in (req.width, req.height, req.steps)):
        raise HTTPError(400, "image generation models are not supported", param="width")
    if req.images:
        _check_images(state, "images")
    plain = req.raw or req.suffix  # the completions path: no template, no think block
    if plain and req.images:
        raise HTTPError(400, "images need the templated mode (no raw, no suffix)", param="images")
    if req.suffix and req.context:
        raise HTTPError(400, "context cannot be combined with suffix", param="context")
    if plain and req.think:
        raise HTTPError(400, "think needs the templated mode (no raw, no suffix)", param="think")
    if plain and req.logprobs:
        raise HTTPError(
            400, "logprobs are given in the templated mode only (no raw, no suffix)", "logprobs"
        )
    vocab = state.scheduler_info["vocab_size"]
    bad = next((t for t in req.context or [] if not 0 <= t < vocab), None)
    if bad is not None:
        raise HTTPError(
            400, f"context has token id {bad}, outside the vocabulary [0, {vocab})", param="context"
        )


async def _completion_request(
    state: ServerState, req: GenerateRequest, model: str
) -> CompletionRequest:
    """Raw and fill-in-the-middle generate as a completions request on the prompt's ids (encoded
    as /generate encodes text; the FIM layout as /v1/completions' suffix builds it)."""
    tm = state.tokenizer_manager
    try:
        if req.suffix:
            ids = (await fim_prompt_ids(state, req.prompt, req.suffix))[0]
        else:
            ids = await tm.tokenizer_pool.run(
                tm.encode_prompt, req.prompt, what="tokenizing the prompt"
            )
    except ValueError as e:
        raise HTTPError(400, str(e), param="prompt") from None
    if not ids:
        raise HTTPError(400, "the prompt is empty after tokenization", param="prompt")
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max(state.context_len - len(ids), 0),  # num_predict -1: to the end
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling(req.options),
    }
    if req.format == "json":
        body["json_schema"] = ANY_JSON_OBJECT
    elif isinstance(req.format, dict):
        body["json_schema"] = json.dumps(req.format)
    return parse_body(CompletionRequest, body)


# ------------------------------------------------------------------ embeddings
@router.post("/api/embed", openapi_extra=json_body(EmbedRequest.model_json_schema()))
async def embed(request: Request):
    async def handle():
        started = time.perf_counter_ns()
        req: EmbedRequest = parse_body(EmbedRequest, await read_json(request))
        state = srv(request)
        resolve_model(state, req.model)
        _check_options(state, req.options)
        texts = req.input
        if not (
            isinstance(texts, str)
            or (isinstance(texts, list) and all(isinstance(t, str) for t in texts))
        ):
            raise HTTPError(400, "input must be a string or a list of strings", param="input")
        if texts == []:  # Ollama answers an empty list with no embeddings
            return JSONResponse({"model": req.model, "embeddings": []})
        res = await encode_inputs(request, texts, req.dimensions)
        return JSONResponse(
            {
                "model": req.model,
                "embeddings": res.embeddings,
                "total_duration": time.perf_counter_ns() - started,
                "load_duration": 0,
                "prompt_eval_count": res.prompt_tokens,
            }
        )

    return await _answer(request, handle)


@router.post("/api/embeddings", openapi_extra=json_body(EmbeddingsRequest.model_json_schema()))
async def embeddings(request: Request):
    """The older, one-prompt form (an empty prompt: an empty embedding, as Ollama answers)."""

    async def handle():
        req: EmbeddingsRequest = parse_body(EmbeddingsRequest, await read_json(request))
        state = srv(request)
        resolve_model(state, req.model)
        _check_options(state, req.options)
        if not req.prompt:
            return JSONResponse({"embedding": []})
        res = await encode_inputs(request, req.prompt, None, field="prompt")
        return JSONResponse({"embedding": res.embeddings[0]})

    return await _answer(request, handle)


# ------------------------------------------------------------------ models
@router.get("/api/tags")
async def list_tags(request: Request):
    return await _answer(request, lambda: _json(tags(srv(request))))


@router.get("/api/ps")
async def list_running(request: Request):
    return await _answer(request, lambda: _json(running(srv(request))))


@router.post("/api/show", openapi_extra=json_body(ShowRequest.model_json_schema()))
async def show_model(request: Request):
    async def handle():
        req: ShowRequest = parse_body(ShowRequest, await read_json(request))
        state = srv(request)
        resolve_model(state, req.model)
        return JSONResponse(show(state, req.model))

    return await _answer(request, handle)


@router.get("/api/version")
async def version(request: Request):
    """radixlm's version (the API follows Ollama's; no Ollama version is claimed)."""
    return JSONResponse({"version": __version__})


async def _json(body: dict) -> JSONResponse:
    return JSONResponse(body)
