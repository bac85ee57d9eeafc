"""llama-server's `/infill` (tools/server/README.md): code infilling from input_prefix and
input_suffix, with input_extra (other files' chunks) before them and `prompt` after <FIM_MID>,
answered in the shape of llama-server's /completion (content, tokens, stop, stop_type, ...).

The prompt is built as llama-server builds it (server/fim.py: psm_ids, repo_context_ids), within
its budget: the prefix's last 3/4 of a batch of tokens, the suffix's first 1/4 (less the prompt),
and the extra context's last tokens that leave room for a batch and twice n_predict; the batch is
llama-server's default 2048, or half the context length when that is smaller. Text is encoded as
plain text (a FIM token spelled in the code stays text), except `prompt`, as llama-server does.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from radixlm.ipc import GenerateReqInput
from radixlm.server.api_common import (
    STREAM_ERRORS,
    HTTPError,
    ServerState,
    json_body,
    observe,
    parse_body,
    read_json,
    run_until_disconnect,
    served_model_name,
    srv,
    sse,
    stream_error_event,
)
from radixlm.server.fanout import admit_to_queue, check_fanout
from radixlm.server.fim import FimTokens, fim_tokens, no_fim_message, psm_ids, repo_context_ids
from radixlm.server.llama_protocol import finished_fields
from radixlm.server.sampling_builder import ClientNames, build_sampling_params

N_BATCH = 2048  # llama-server's default --batch-size, which sizes its infill budget
_TEXT = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
    ]
}


class ExtraChunk(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    filename: str = "tmp"  # llama-server's default


class InfillRequest(BaseModel):
    """llama-server's /infill fields, and those of its /completion options radixlm honours."""

    model_config = ConfigDict(extra="forbid", strict=True)
    input_prefix: Any = Field(json_schema_extra=_TEXT)
    input_suffix: Any = Field(json_schema_extra=_TEXT)
    input_extra: list[ExtraChunk] = []
    prompt: str = ""
    n_predict: int = Field(-1, ge=-1)  # -1: up to the end of the context
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] = []
    ignore_eos: bool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None
    stream: bool = False
    return_tokens: bool = False
    model: str | None = None  # echoed back
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    # Editor plugins' hints, accepted and ignored: the radix cache always reuses a cached prompt
    # (cache_prompt); time limits, indentation stops, slots, sampler order and field selection are
    # not done.
    cache_prompt: bool | None = None
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None
    n_indent: int | None = None
    id_slot: int | None = None
    samplers: list[str] | None = None
    response_fields: list[str] | None = None


# llama-server's names for the native sampling fields.
_NATIVE = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "seed": "seed",
    "ignore_eos": "ignore_eos",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repetition_penalty",
}
_CLIENT_NAMES = ClientNames({v: k for k, v in _NATIVE.items()} | {"max_new_tokens": "n_predict"})


def _mixed(encode, value: Any, field: str) -> list[int]:
    """A string, or llama-server's mixed list of token ids and strings."""
    if isinstance(value, str):
        return encode(value)
    if isinstance(value, list) and all(
        isinstance(x, (str, int)) and not isinstance(x, bool) for x in value
    ):
        return [t for x in value for t in ([x] if isinstance(x, int) else encode(x))]
    raise HTTPError(
        400, f"{field} must be a string or a list of token ids and strings", param=field
    )


def infill_prompt(tok, fim: FimTokens, req: InfillRequest, ctx: int, n_predict: int) -> list[int]:
    """On a tokenizer thread: llama-server's format_prompt_infill, with the README's place for
    `prompt`."""
    plain = functools.partial(tok.encode, add_special_tokens=False, split_special_tokens=True)
    prompt = tok.encode(req.prompt, add_special_tokens=False) if req.prompt else []
    prefix, suffix = (
        _mixed(plain, req.input_prefix, "input_prefix"),
        _mixed(plain, req.input_suffix, "input_suffix"),
    )
    extra = repo_context_ids(fim, plain, [(c.filename, c.text) for c in req.input_extra])
    batch = min(N_BATCH, ctx // 2)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (batch // 4)) :]
    suffix = suffix[: max(0, batch // 4 - (2 + len(prompt)))]
    core = len(psm_ids(fim, prefix, suffix, (), prompt))
    # llama-server's share for the extra context, and never more than the context has left.
    n_extra = min(max(0, ctx - batch - 2 * max(n_predict, 0)), len(extra), max(0, ctx - 1 - core))
    return psm_ids(fim, prefix, suffix, extra[len(extra) - n_extra :], prompt)


def _sampling(state: ServerState, req: InfillRequest, fim: FimTokens, prompt_len: int) -> dict:
    room = state.context_len - prompt_len
    then = {"stop": req.stop} if req.stop else {}
    if fim.end_of_generation:  # llama.cpp ends at a FIM pad / repo / file separator token
        then["stop_token_ids"] = fim.end_of_generation
    return build_sampling_params(
        req,
        _NATIVE,
        state.scheduler_info["vocab_size"],
        _CLIENT_NAMES,
        first={"max_new_tokens": room if req.n_predict < 0 else min(req.n_predict, room)},
        then=then,
    )


router = APIRouter()


@router.post("/infill", openapi_extra=json_body(InfillRequest.model_json_schema()))
async def infill(request: Request):
    state = srv(request)
    req = parse_body(InfillRequest, await read_json(request))
    tm = state.tokenizer_manager
    fim = fim_tokens(tm.tokenizer, state.server_args.completion_template)
    if fim is None:
        raise HTTPError(400, no_fim_message("/infill"), param="input_prefix")
    texts = [req.prompt, *(c.text + c.filename for c in req.input_extra)]
    texts += [
        x
        for v in (req.input_prefix, req.input_suffix)
        for x in (v if isinstance(v, list) else [v])
        if isinstance(x, str)
    ]
    if (
        sum(map(len, texts)) > 4 * state.context_len * tm.max_token_chars
    ):  # far past what any budget keeps
        raise HTTPError(
            400, "the request's text is far longer than the context length", param="input_prefix"
        )
    check_fanout(state, 1, 1, "input_prefix")
    ids = await tm.tokenizer_pool.run(
        infill_prompt,
        tm.tokenizer,
        fim,
        req,
        state.context_len,
        req.n_predict,
        what="tokenizing the infill prompt",
    )
    if len(ids) >= state.context_len:
        raise HTTPError(
            400,
            f"the infill prompt has {len(ids)} tokens; this model's context length is "
            f"{state.context_len}",
            param="prompt",
        )
    obj = GenerateReqInput(
        input_ids=ids,
        sampling_params=_sampling(state, req, fim, len(ids)),
        rid=uuid.uuid4().hex,
        stream=req.stream,
        cache_salt=req.cache_salt,
    )
    job = _Infill(state, req, ids)
    gen = tm.generate_request(obj, admit=admit_to_queue(state))
    try:
        first = await run_until_disconnect(request, gen.__anext__())
    except ValueError as e:
        raise HTTPError(400, str(e)) from None
    if req.stream:
        return StreamingResponse(job.stream(gen, first), media_type="text/event-stream")
    out = first
    try:
        # not streamed: the one final answer
        async for out in gen:  # noqa: B007 (the last item is the result)
            pass
    finally:
        await gen.aclose()
    observe(state, out)
    return job.final(out, out["text"], out["output_ids"])


class _Infill:
    """One /infill request's answers in llama-server's /completion shape."""

    def __init__(self, state: ServerState, req: InfillRequest, ids: list[int]):
        self.state, self.req, self.ids = state, req, ids

    def final(self, out: dict, content: str, tokens: list[int]) -> dict:
        tok = self.state.tokenizer_manager.tokenizer
        shown = tokens if self.req.return_tokens or self.req.stream else []
        return {
            **finished_fields(
                self.ids, out, content, shown, tok.decode(self.ids), self.state.context_len
            ),
            "model": (
                self.req.model
                or served_model_name(self.state.server_args, self.state.scheduler_info)
            ),
        }

    async def stream(self, gen: AsyncIterator, first: dict) -> AsyncIterator[bytes]:
        text_sent, ids_sent = 0, 0
        out: dict | None = first
        try:
            while out is not None:
                text, ids = out["text"], out["output_ids"]
                if out["meta_info"]["finish_reason"] is not None:
                    observe(self.state, out)
                    yield sse(self.final(out, text[text_sent:], ids[ids_sent:]))
                    return
                if len(text) > text_sent or len(ids) > ids_sent:
                    yield sse(
                        {
                            "index": 0,
                            "content": text[text_sent:],
                            "tokens": ids[ids_sent:],
                            "stop": False,
                        }
                    )
                text_sent, ids_sent = len(text), len(ids)
                out = await anext(gen, None)
        except STREAM_ERRORS as e:  # the stream started: errors are events, as on the other routes
            yield stream_error_event(e)
        finally:
            await gen.aclose()
