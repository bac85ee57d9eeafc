"""HTTP pieces the server and the router share, free of the engine (the router imports nothing of it)."""

from __future__ import annotations

import secrets

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers


def error_json(status: int, message: str, kind: str = "invalid_request_error", param=None) -> JSONResponse:
    # One shape for both APIs: OpenAI's {"error": {...}}, which SGLang clients also read.
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}, "object": "error"},
        status_code=status,
    )


class APIKeyMiddleware:
    """Bearer-key check on every route but /health (liveness probes carry no key; Prometheus
    scrapes /metrics with `authorization: {credentials: <key>}`). A plain ASGI middleware:
    FastAPI's @app.middleware("http") passes each streamed chunk through an extra task and
    memory stream, which costs a streaming request CPU on every token."""

    OPEN_PATHS = ("/health",)

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and scope["path"] not in self.OPEN_PATHS:
            key = scope["app"].state.api_key
            if key:
                auth = Headers(scope=scope).get("authorization", "")
                if not secrets.compare_digest(auth.encode(), f"Bearer {key}".encode()):
                    response = error_json(401, "invalid or missing API key (Authorization: Bearer <key>)",
                                          "authentication_error")
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)
