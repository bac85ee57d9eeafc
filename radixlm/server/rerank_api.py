"""`/v1/rerank` and `/rerank` (also `/v2/rerank`): Cohere's and Jina's rerank shape, as llama-server
and SGLang serve it, on a reranker model (engine/rerank.py does the work; model/reranker.py says
which models are rerankers):

    {"model", "query", "documents": [str | {"text": str}], "top_n", "return_documents",
     "instruct" (SGLang's: a yes/no reranker's instruction), "raw_scores" (TEI's)}
 -> {"id", "model", "results": [{"index", "relevance_score", "document": {"text"}?}],
     "usage": {"prompt_tokens", "total_tokens", "prompt_tokens_details": {"cached_tokens"}}}

results are sorted by relevance_score, highest first (ties keep the documents' order), the first
top_n of them when it is given.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from radixlm.engine.rerank import RerankError, rerank
from radixlm.engine.scoring import ScoreError
from radixlm.model.reranker import YES_NO
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

_DOCUMENT = {
    "anyOf": [
        {"type": "string"},
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ]
}


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: str = Field(min_length=1)
    # Checked in documents_text (a clear 400 naming the item, rather than pydantic's union error).
    documents: Any = Field(json_schema_extra={"type": "array", "items": _DOCUMENT})
    model: str | None = None
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False  # Cohere's default
    instruct: str | None = Field(None, min_length=1)
    raw_scores: bool = False


def documents_text(documents: Any) -> list[str]:
    """Each document's text: a string, or an object with a string `text` (Cohere v2, Jina)."""
    if not isinstance(documents, list) or not documents:
        raise HTTPError(
            400,
            "documents must be a non-empty list of strings or {text} objects",
            param="documents",
        )
    texts = []
    for i, d in enumerate(documents):
        text = d.get("text") if isinstance(d, dict) and set(d) == {"text"} else d
        if not isinstance(text, str):
            raise HTTPError(
                400,
                f'documents[{i}] must be a string or an object {{"text": string}}',
                param=f"documents[{i}]",
            )
        texts.append(text)
    return texts


router = APIRouter()


@router.post("/v1/rerank", openapi_extra=json_body(RerankRequest.model_json_schema()))
@router.post("/v2/rerank", include_in_schema=False)
@router.post("/rerank", include_in_schema=False)
async def rerank_route(request: Request):
    state = srv(request)
    req = parse_body(RerankRequest, await read_json(request))
    model = requested_model(state, req.model).name
    docs = documents_text(req.documents)
    cap = state.server_args.max_client_batch_size
    if len(docs) > cap:
        raise HTTPError(
            400,
            f"{len(docs)} documents, more than --max-client-batch-size {cap}",
            param="documents",
        )
    kind = (state.scheduler_info.get("reranker") or {}).get("kind")
    per_doc = 2 if kind == YES_NO else 1  # a yes/no reranker: a sequence per label token
    check_queue(state, per_doc * len(docs), "documents")
    try:
        res = await run_until_disconnect(
            request,
            rerank(state.tokenizer_manager, req.query, docs, req.instruct, admit_to_queue(state)),
        )
    except (RerankError, ScoreError) as e:
        param = "documents" if e.param == "items" else e.param
        raise HTTPError(400, str(e), param=param) from None
    except ValueError as e:  # the engine's own checks (a prompt past the context, ...)
        raise HTTPError(400, str(e), param="documents") from None
    scores = res.scores(req.raw_scores)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[: req.top_n]
    results = []
    for i in order:
        item: dict = {"index": i, "relevance_score": scores[i]}
        if req.return_documents:
            item["document"] = {"text": docs[i]}
        results.append(item)
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "model": model,
        "results": results,
        "usage": {
            "prompt_tokens": res.prompt_tokens,
            "total_tokens": res.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": res.cached_tokens},
        },
    }
