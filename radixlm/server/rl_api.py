"""SGLang's routes for RL loops (docs/rl.md), admin actions like /flush_cache (http_access.py):

  POST     /update_weights_from_disk    {model_path, load_format?, abort_all_requests?, flush_cache?,
                                         weight_version?, keep_pause?} -> {success, message, num_paused_requests}
  GET|POST /get_weights_by_name         {name, truncate_size?} -> the tensor's first rows, float lists
  POST     /pause_generation            {mode?: abort | retract | in_place}
  POST     /continue_generation
  POST     /release_memory_occupation   {tags?: [weights, kv_cache]}
  POST     /resume_memory_occupation    {tags?}

A refused call is a 400 in the server's error shape, naming the field; /update_weights_from_disk's
also carries SGLang's {success: false, message} for clients that read those. The actions that
change state are POST only (a GET is what a page's link can send); SGLang also takes GET for the
memory routes.
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from radixlm.engine.rl_control import (
    FieldError,
    continue_request,
    get_weights_request,
    memory_request,
    pause_request,
    update_weights_request,
)
from radixlm.http_common import error_json
from radixlm.ipc import ReleaseMemoryOccupationReqInput, ResumeMemoryOccupationReqInput
from radixlm.server.api_common import HTTPError, json_body, read_json, srv

router = APIRouter()

RL_ADMIN_PATHS = (
    "/update_weights_from_disk",
    "/get_weights_by_name",
    "/pause_generation",
    "/continue_generation",
    "/release_memory_occupation",
    "/resume_memory_occupation",
)


async def _body(request: Request) -> Any:
    """The JSON body; none at all is an empty one (every field of these calls but two is
    optional)."""
    chunked = "chunked" in request.headers.get("transfer-encoding", "")
    if request.headers.get("content-length", "0") == "0" and not chunked:
        return {}
    return await read_json(request)


def _parse(build: Callable[[Any], Any], body: Any):
    try:
        return build(body)
    except FieldError as e:
        raise HTTPError(400, str(e), param=e.field) from None


async def _call(coro, param: str):
    """Await a tokenizer-manager call; its refusal (ValueError) is a 400 naming param."""
    try:
        return await coro
    except ValueError as e:
        raise HTTPError(400, str(e), param=param) from None


_OBJ = {"type": "object"}


@router.post(
    "/update_weights_from_disk",
    openapi_extra=json_body(
        {
            **_OBJ,
            "required": ["model_path"],
            "properties": {
                "model_path": {"type": "string", "minLength": 1},
                "load_format": {"type": ["string", "null"]},
                "abort_all_requests": {"type": "boolean"},
                "flush_cache": {"type": "boolean"},
                "weight_version": {"type": ["string", "null"]},
                "keep_pause": {"type": "boolean"},
            },
        }
    ),
)
async def update_weights_from_disk(request: Request):
    obj = _parse(update_weights_request, await read_json(request))
    try:
        out = await srv(request).tokenizer_manager.rl.update_weights_from_disk(obj)
    except ValueError as e:  # the checkpoint was refused: the old weights serve on
        response = error_json(
            400, str(e), param="load_format" if str(e).startswith("load_format") else "model_path"
        )
        body = json.loads(response.body)
        return JSONResponse(
            {**body, "success": False, "message": str(e), "num_paused_requests": 0}, status_code=400
        )
    return {
        "success": out.success,
        "message": out.message,
        "num_paused_requests": out.num_paused_requests,
    }


@router.api_route(
    "/get_weights_by_name",
    methods=["GET", "POST"],
    openapi_extra=json_body(
        {
            **_OBJ,
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "truncate_size": {"type": "integer", "minimum": 0},
            },
        }
    ),
)
async def get_weights_by_name(request: Request):
    obj = _parse(get_weights_request, await read_json(request))
    return JSONResponse(
        await _call(srv(request).tokenizer_manager.rl.get_weights_by_name(obj), "name")
    )


@router.post(
    "/pause_generation",
    openapi_extra=json_body(
        {**_OBJ, "properties": {"mode": {"enum": ["abort", "retract", "in_place"]}}}
    ),
)
async def pause_generation(request: Request):
    obj = _parse(pause_request, await _body(request))
    message = await _call(srv(request).tokenizer_manager.rl.pause_generation(obj), "mode")
    return {"message": message, "status": "ok"}


@router.post("/continue_generation")
async def continue_generation(request: Request):
    obj = _parse(continue_request, await _body(request))
    message = await _call(srv(request).tokenizer_manager.rl.continue_generation(obj), "body")
    return {"message": message, "status": "ok"}


_TAGS = json_body(
    {
        **_OBJ,
        "properties": {
            "tags": {
                "anyOf": [
                    {"type": "null"},
                    {"type": "array", "items": {"enum": ["weights", "kv_cache", "cuda_graph"]}},
                ]
            }
        },
    }
)


@router.post("/release_memory_occupation", openapi_extra=_TAGS)
async def release_memory_occupation(request: Request):
    obj = _parse(
        lambda b: memory_request(b, ReleaseMemoryOccupationReqInput, "release_memory_occupation"),
        await _body(request),
    )
    message = await _call(srv(request).tokenizer_manager.rl.release_memory_occupation(obj), "tags")
    return {"success": True, "message": message}


@router.post("/resume_memory_occupation", openapi_extra=_TAGS)
async def resume_memory_occupation(request: Request):
    obj = _parse(
        lambda b: memory_request(b, ResumeMemoryOccupationReqInput, "resume_memory_occupation"),
        await _body(request),
    )
    message = await _call(srv(request).tokenizer_manager.rl.resume_memory_occupation(obj), "tags")
    return {"success": True, "message": message}
