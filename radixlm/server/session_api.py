"""SGLang's session routes: POST /open_session, POST /close_session, and /generate's
`session_params` (engine/sessions.py does the work; this is the HTTP edge). Sessions belong to the
API key that opened them: the limit per key counts them, and another key cannot use or close them.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlm.engine.sessions import SessionError, SessionManager, session_manager
from radixlm.http_access import presented_key
from radixlm.ipc import GenerateReqInput
from radixlm.server.api_common import HTTPError, json_body, read_json, srv

router = APIRouter()


def sessions(request: Request) -> SessionManager:
    s = srv(request)
    return session_manager(s.tokenizer_manager, s.server_args)


def owner(request: Request) -> str:
    """The caller's key, hashed (the middleware has checked it; a key is not kept in memory
    twice)."""
    return hashlib.sha256(presented_key(request.headers).encode()).hexdigest()[:32]


def pop_session_params(body: Any) -> Any | None:
    """/generate's session_params, taken out of the body (None or {}: no session)."""
    if not isinstance(body, dict):
        return None
    params = body.pop("session_params", None)
    return None if params in (None, {}) else params


async def session_turn(
    request: Request, obj: GenerateReqInput, params: Any, admit
) -> AsyncIterator[Any]:
    """Validates the turn now (a bad one is a 4xx before any stream starts); returns its
    responses."""
    m = sessions(request)
    try:
        plan = await m.prepare(owner(request), obj, params)
    except SessionError as e:
        raise HTTPError(e.status, e.message, param=e.param) from None
    return m.run(plan, admit)


_OPEN = {
    "type": "object",
    "properties": {
        "capacity_of_str_len": {"type": "integer", "minimum": 1},
        "session_id": {"type": "string"},
        "timeout": {"type": "number", "exclusiveMinimum": 0},
        "streaming": {"type": "boolean"},
    },
}


@router.post("/open_session", openapi_extra=json_body(_OPEN))
async def open_session(request: Request):
    """Returns the session's id (a JSON string, as SGLang's route)."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    try:
        return JSONResponse(sessions(request).open(owner(request), body))
    except SessionError as e:
        raise HTTPError(e.status, e.message, param=e.param) from None


@router.post(
    "/close_session",
    openapi_extra=json_body(
        {
            "type": "object",
            "properties": {"session_id": {"type": "string"}},
            "required": ["session_id"],
        }
    ),
)
async def close_session(request: Request):
    body = await read_json(request)
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    try:
        sessions(request).close(owner(request), body.get("session_id"))
    except SessionError as e:
        raise HTTPError(e.status, e.message, param=e.param) from None
    return Response(status_code=200)
