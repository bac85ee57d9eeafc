"""SGLang's observability routes, all admin actions (http_access.py: the /flush_cache key rule):
/start_profile and /stop_profile (a torch profiler trace of the scheduler, written to a directory
on the server) and /configure_logging (the request log's switches at run time). POST only, as
/flush_cache: a GET is what a web page's <img> or link can send (SGLang also takes GET)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from radixlm.engine.profiling import FIELDS as PROFILE_FIELDS
from radixlm.server.api_common import HTTPError, json_body, read_json, srv

ADMIN_PATHS = ("/start_profile", "/stop_profile", "/configure_logging")
_LOGGING_FIELDS = ("log_requests", "log_requests_level", "log_requests_format")

router = APIRouter()


async def _optional_json(request: Request):
    """The body, or None when there is none (SGLang's `curl -X POST .../start_profile`)."""
    h = request.headers
    if h.get("content-length", "0") == "0" and "transfer-encoding" not in h:
        return None
    return await read_json(request)


def _bad(e: ValueError, fields) -> HTTPError:
    """A 400 naming the field the message starts with (the checks' messages do)."""
    first = str(e).split(" ", 1)[0].rstrip(":")
    return HTTPError(400, str(e), param=first if first in fields else None)


def _answer(out) -> Response:
    if not out.success:
        raise _bad(ValueError(out.message), PROFILE_FIELDS)
    return Response(out.message + "\n", media_type="text/plain")


_PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "output_dir": {"type": "string"},
        "start_step": {"type": "integer", "minimum": 0},
        "num_steps": {"type": "integer", "minimum": 1},
        "activities": {"type": "array", "items": {"type": "string", "enum": ["CPU", "GPU", "MEM"]}},
        "with_stack": {"type": "boolean"},
        "record_shapes": {"type": "boolean"},
        "profile_prefix": {"type": "string"},
    },
}


_START_BODY = json_body(_PROFILE_SCHEMA)
_START_BODY["requestBody"]["required"] = False  # an empty POST starts with the defaults


@router.post("/start_profile", openapi_extra=_START_BODY)
async def start_profile(request: Request):
    body = await _optional_json(request)
    try:
        out = await srv(request).tokenizer_manager.profiler.start(body)
    except ValueError as e:
        raise _bad(e, PROFILE_FIELDS) from None
    return _answer(out)


@router.post("/stop_profile")
async def stop_profile(request: Request):
    return _answer(await srv(request).tokenizer_manager.profiler.stop())


@router.post(
    "/configure_logging",
    openapi_extra=json_body(
        {
            "type": "object",
            "properties": {
                "log_requests": {"type": "boolean"},
                "log_requests_level": {"type": "integer", "enum": [0, 1, 2, 3]},
                "log_requests_format": {"type": "string", "enum": ["text", "json"]},
            },
        }
    ),
)
async def configure_logging(request: Request):
    body = await read_json(request)
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - set(_LOGGING_FIELDS))
    if unknown:  # SGLang's dump_requests_* and crash_dump_folder: start-up options here
        raise HTTPError(
            400,
            f"unsupported field(s): {', '.join(unknown)} (fields: {', '.join(_LOGGING_FIELDS)})",
            param=unknown[0],
        )
    try:
        cfg = srv(request).tokenizer_manager.observability.configure_logging(**body)
    except ValueError as e:
        raise _bad(e, _LOGGING_FIELDS) from None
    return JSONResponse(
        {
            "log_requests": cfg.enabled,
            "log_requests_level": cfg.level,
            "log_requests_format": cfg.format,
        }
    )
