"""SGLang's `/v1/score`: the probabilities of label tokens after query + item, per item
(engine/scoring.py does the work; this is the HTTP shape of sglang's serving_score.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from radixlm.engine.scoring import ScoreError, score_request
from radixlm.server.api_common import (
    HTTPError,
    check_queue,
    json_body,
    parse_body,
    read_json,
    run_until_disconnect,
    served_model_name,
    srv,
)
from radixlm.server.fanout import admit_to_queue

_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_TEXT_OR_IDS = {"anyOf": [{"type": "string"}, _IDS]}


class ScoringRequest(BaseModel):
    """sglang/srt/entrypoints/openai/protocol.py: ScoringRequest (text with text, ids with ids)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    query: Any = Field(None, json_schema_extra=_TEXT_OR_IDS)
    items: Any = Field(
        None,
        json_schema_extra={
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}},
                {"type": "array", "items": _IDS},
            ]
        },
    )
    label_token_ids: Any = Field(None, json_schema_extra=_IDS)
    apply_softmax: bool = False
    item_first: bool = False
    model: str | None = None  # echoed back, as SGLang does (it names no other model)
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)  # as on the other routes


router = APIRouter()


@router.post("/v1/score", openapi_extra=json_body(ScoringRequest.model_json_schema()))
async def score(request: Request):
    state = srv(request)
    req = parse_body(ScoringRequest, await read_json(request))
    items = len(req.items) if isinstance(req.items, list) else 1
    labels = len(req.label_token_ids) if isinstance(req.label_token_ids, list) else 1
    cap = state.server_args.max_client_batch_size
    if items * labels > cap:  # each (item, label) pair is one sequence
        raise HTTPError(
            400,
            f"{items} items x {labels} label_token_ids make {items * labels} sequences, more than "
            f"--max-client-batch-size {cap}",
            param="items",
        )
    check_queue(state, items * labels, "items")
    try:
        result = await run_until_disconnect(
            request,
            score_request(
                state.tokenizer_manager,
                req.query,
                req.items,
                req.label_token_ids,
                req.apply_softmax,
                req.item_first,
                admit=admit_to_queue(state),
                cache_salt=req.cache_salt,
            ),
        )
    except ScoreError as e:
        raise HTTPError(400, str(e), param=e.param) from None
    except ValueError as e:  # the engine's own checks (a prompt past the context, ...)
        raise HTTPError(400, str(e), param="items") from None
    return {
        "scores": result.scores,
        "model": req.model or served_model_name(state.server_args, state.scheduler_info),
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": 0,
            "total_tokens": result.prompt_tokens,
        },
        "object": "scoring",
    }
