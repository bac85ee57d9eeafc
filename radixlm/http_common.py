"""HTTP pieces the server and the router share, free of the engine (the router imports nothing of
it)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse


def error_json(
    status: int, message: str, kind: str = "invalid_request_error", param=None
) -> JSONResponse:
    # One shape for both APIs: OpenAI's {"error": {...}}, which SGLang clients also read.
    return JSONResponse(
        {
            "error": {"message": message, "type": kind, "param": param, "code": status},
            "object": "error",
        },
        status_code=status,
    )


def anthropic_error(kind: str, message: str) -> dict:
    """Anthropic's error shape (/v1/messages): a response body, or a stream's error event."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_json_for(
    path: str, status: int, message: str, kind: str = "invalid_request_error", param=None
) -> JSONResponse:
    """An error in the shape of the API the path belongs to: Anthropic's for /v1/messages, Ollama's
    ({"error": message}) under /api/, else error_json's."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return JSONResponse(anthropic_error(kind, message), status_code=status)
    if path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    return error_json(status, message, kind, param)


async def read_bounded(request: Request, limit: int, too_big: Exception) -> bytes:
    """The request's body, at most `limit` bytes: checked on Content-Length before reading and again
    while reading (a chunked upload cannot grow past it); `too_big` is raised past it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)
