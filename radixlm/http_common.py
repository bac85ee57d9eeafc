"""HTTP pieces the server and the router share, free of the engine (the router imports nothing of it)."""

from __future__ import annotations

from fastapi.responses import JSONResponse


def error_json(status: int, message: str, kind: str = "invalid_request_error", param=None) -> JSONResponse:
    # One shape for both APIs: OpenAI's {"error": {...}}, which SGLang clients also read.
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}, "object": "error"},
        status_code=status,
    )

