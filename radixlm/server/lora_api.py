"""SGLang's LoRA admin routes (docs/lora.md), admin actions (http_access.py):

  POST /load_lora_adapter    {lora_name, lora_path, pinned?} -> {success, error_message, loaded_adapters}
  POST /unload_lora_adapter  {lora_name}                     -> the same

A name already loaded is a 409, an unknown one to unload a 404, a bad body or adapter a 400 naming
the field. Unloading an adapter that requests use waits for them to finish (SGLang's behaviour).
/v1/models lists the loaded adapters beside the base model (lora_model_cards).
"""  # noqa: E501 (diagrams and command lines kept whole)

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from radixlm.engine.lora_control import LoRAError
from radixlm.server.api_common import HTTPError, ServerState, json_body, read_json, srv

router = APIRouter()

LORA_ADMIN_PATHS = ("/load_lora_adapter", "/unload_lora_adapter")
_FIELDS = {
    "/load_lora_adapter": ("lora_name", "lora_path", "pinned"),
    "/unload_lora_adapter": ("lora_name",),
}


def _fields(body: Any, route: str) -> dict:
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - set(_FIELDS[route]))
    if unknown:
        raise HTTPError(400, f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    if "lora_name" not in body:
        raise HTTPError(400, "lora_name is required", param="lora_name")
    return body


def _answer(state: ServerState) -> dict:
    return {
        "success": True,
        "error_message": "",
        "loaded_adapters": {
            a.lora_name: a.lora_path for a in state.tokenizer_manager.lora.served_adapters()
        },
    }


async def _call(coro):
    try:
        await coro
    except LoRAError as e:
        raise HTTPError(
            e.status_code,
            str(e),
            "not_found_error" if e.status_code == 404 else "invalid_request_error",
            e.field,
        ) from None


_NAME = {"type": "string", "minLength": 1}


@router.post(
    "/load_lora_adapter",
    openapi_extra=json_body(
        {
            "type": "object",
            "required": ["lora_name", "lora_path"],
            "properties": {"lora_name": _NAME, "lora_path": _NAME, "pinned": {"type": "boolean"}},
        }
    ),
)
async def load_lora_adapter(request: Request):
    state = srv(request)
    body = _fields(await read_json(request), "/load_lora_adapter")
    await _call(
        state.tokenizer_manager.lora.load_lora_adapter(
            body["lora_name"], body.get("lora_path"), body.get("pinned", False)
        )
    )
    return _answer(state)


@router.post(
    "/unload_lora_adapter",
    openapi_extra=json_body(
        {"type": "object", "required": ["lora_name"], "properties": {"lora_name": _NAME}}
    ),
)
async def unload_lora_adapter(request: Request):
    state = srv(request)
    body = _fields(await read_json(request), "/unload_lora_adapter")
    await _call(state.tokenizer_manager.lora.unload_lora_adapter(body["lora_name"]))
    return _answer(state)


def lora_model_cards(state: ServerState, base: dict) -> list[dict]:
    """/v1/models' entries of the loaded adapters (SGLang's: the adapter's name, its path as root,
    the base model as parent); a request names one as "BASE:ADAPTER" or, as SGLang, the adapter
    alone.
    """
    return [
        {**base, "id": a.lora_name, "root": a.lora_path, "parent": base["id"]}
        for a in state.tokenizer_manager.lora.served_adapters()
    ]
