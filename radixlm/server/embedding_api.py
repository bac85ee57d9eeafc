"""`/v1/embeddings` (OpenAI's shape) and SGLang's `/encode` on a server started with --is-embedding
(engine/embedding.py does the work; a generation server answers both with a 400)."""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from radixlm.engine.embedding import EmbeddingError, embed
from radixlm.server.api_common import (
    HTTPError,
    check_queue,
    json_body,
    parse_body,
    read_json,
    run_until_disconnect,
    srv,
)
from radixlm.server.fanout import admit_to_queue
from radixlm.server.model_names import requested_model

_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_INPUT = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}},
        _IDS,
        {"type": "array", "items": _IDS},
    ]
}


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings.create body (`user` accepted and unused, as vLLM and SGLang)."""

    model_config = ConfigDict(extra="forbid")
    input: Any = Field(json_schema_extra=_INPUT)
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class EncodeRequest(BaseModel):
    """SGLang's /encode (EmbeddingReqInput): text or input_ids, one or a batch."""

    model_config = ConfigDict(extra="forbid")
    text: Any = Field(
        None,
        json_schema_extra={
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
        },
    )
    input_ids: Any = Field(
        None, json_schema_extra={"anyOf": [_IDS, {"type": "array", "items": _IDS}]}
    )
    rid: Any = None
    dimensions: int | None = None


router = APIRouter()


async def encode_inputs(
    request: Request, inp: Any, dimensions: int | None, rid: Any = None, field: str = "input"
):
    state = srv(request)
    batch = len(inp) if isinstance(inp, list) and inp and not isinstance(inp[0], int) else 1
    cap = state.server_args.max_client_batch_size
    if batch > cap:
        raise HTTPError(
            400, f"{field} has {batch} items, more than --max-client-batch-size {cap}", param=field
        )
    check_queue(state, batch, field)
    try:
        return await run_until_disconnect(
            request,
            embed(
                state.tokenizer_manager,
                inp,
                dimensions=dimensions,
                rid=rid,
                admit=admit_to_queue(state),
                field=field,
            ),
        )
    except EmbeddingError as e:
        raise HTTPError(400, str(e), param=e.param) from None
    except ValueError as e:  # the engine's own checks (the kind of server, a rid in use, ...)
        raise HTTPError(400, str(e), param=field) from None


def _base64(vec: list[float]) -> str:
    """OpenAI's base64 encoding: the little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()


@router.post("/v1/embeddings", openapi_extra=json_body(EmbeddingRequest.model_json_schema()))
async def embeddings(request: Request):
    req = parse_body(EmbeddingRequest, await read_json(request))
    model = requested_model(srv(request), req.model).name
    res = await encode_inputs(request, req.input, req.dimensions)
    as_b64 = req.encoding_format == "base64"
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _base64(e) if as_b64 else e}
            for i, e in enumerate(res.embeddings)
        ],
        "model": model,
        "usage": {"prompt_tokens": res.prompt_tokens, "total_tokens": res.prompt_tokens},
    }


@router.post("/encode", openapi_extra=json_body(EncodeRequest.model_json_schema()))
async def encode(request: Request):
    req = parse_body(EncodeRequest, await read_json(request))
    if (req.text is None) == (req.input_ids is None):
        raise HTTPError(400, "exactly one of text or input_ids must be given", param="text")
    field = "text" if req.text is not None else "input_ids"
    inp = req.text if req.text is not None else req.input_ids
    res = await encode_inputs(request, inp, req.dimensions, req.rid, field)
    outs = [{"embedding": e, "meta_info": m} for e, m in zip(res.embeddings, res.meta_infos)]
    single = isinstance(inp, str) or (
        isinstance(inp, list) and bool(inp) and isinstance(inp[0], int)
    )
    return outs[0] if single else outs
