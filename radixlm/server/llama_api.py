"""llama-server's own endpoints (llama.cpp's tools/server/README.md): /completion (and its alias
/completions), /props, /slots and /slots/{id}?action=save|restore|erase. /tokenize and /detokenize
answer llama-server's body shapes in http_server.py; /infill is infill_api.py's. Fields map to the
native pipeline in llama_protocol.py; slots are llama_slots.py's; a slot's file is written and read
by the scheduler (scheduler/control/slot_files.py). Errors have the shape llama-server answers
({"error": {"code", "message", "type"}}, which radixlm's error shape is)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from radixlm.engine.lora_control import cache_namespace
from radixlm.http_access import Role, access_of, admin_refusal, role_of
from radixlm.ipc import GenerateReqInput, SlotFileReqOutput, SlotRestoreReq, SlotSaveReq
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
from radixlm.server.llama_protocol import (
    CompletionRequest,
    finished_fields,
    generation_settings,
    sampling_params,
)
from radixlm.server.llama_slots import Slot, SlotTable, slot_file_path
from radixlm.version import __version__

FLOAT_LOWEST = -3.4028234663852886e38  # llama-server's log(0) (JSON has no -inf)
router = APIRouter()


def slot_table(request: Request) -> SlotTable:
    """The app's slots (kept across engine restarts: they are HTTP-side bookkeeping)."""
    table = getattr(request.app.state, "llama_slots", None)
    if table is None:
        total = srv(request).scheduler_info.get("max_running_requests") or 1
        table = request.app.state.llama_slots = SlotTable(total)
    return table


def _defaults(state: ServerState) -> dict:
    return state.scheduler_info.get("sampling_defaults") or {}


def _prompt_ids(state: ServerState, prompt) -> list[int]:
    """On a tokenizer thread: a string (encoded as /generate encodes text: the tokenizer's special
    tokens added), or llama-server's list of token ids and strings (a leading string gets them,
    the others are plain text). Several prompts are refused."""
    tm = state.tokenizer_manager
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tm.encode_prompt(prompt)
    if not isinstance(prompt, list) or not all(
        isinstance(x, (str, int)) and not isinstance(x, bool) for x in prompt
    ):
        raise HTTPError(
            400, "prompt must be a string or a list of token ids and strings", param="prompt"
        )
    if len(prompt) > 1 and all(isinstance(x, str) for x in prompt):
        raise HTTPError(
            400, "prompt: one prompt per request (a list of strings is several)", param="prompt"
        )
    ids: list[int] = []
    for i, x in enumerate(prompt):
        if isinstance(x, int):
            ids.append(x)
        else:
            plain = tm.tokenizer.encode(x, add_special_tokens=False) if i else None
            ids += tm.encode_prompt(x) if plain is None else plain
    return ids


def _check_ids(state: ServerState, ids: list[int]) -> None:
    vocab = state.scheduler_info["vocab_size"]
    if not ids:
        raise HTTPError(400, "prompt is empty", param="prompt")
    if not all(0 <= t < vocab for t in ids):
        raise HTTPError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
    if len(ids) >= state.context_len:
        raise HTTPError(
            400,
            f"the prompt has {len(ids)} tokens; this model's context length is {state.context_len}",
            param="prompt",
        )


@router.post("/completion", openapi_extra=json_body(CompletionRequest.model_json_schema()))
@router.post("/completions", include_in_schema=False)  # llama-server's alias
async def completion(request: Request):
    state = srv(request)
    req = parse_body(CompletionRequest, await read_json(request))
    tm = state.tokenizer_manager
    try:
        ids = await tm.tokenizer_pool.run(_prompt_ids, state, req.prompt, what="tokenizing")
    except ValueError as e:
        raise HTTPError(400, f"prompt: {e}", param="prompt") from None
    _check_ids(state, ids)
    sp = sampling_params(req, state.context_len - len(ids), state.scheduler_info["vocab_size"])
    check_fanout(state, 1, 1, "prompt")
    extra = {"stream": req.stream, "n_probs": req.n_probs, "model": _model(state, req)}
    slot = slot_table(request).acquire(req.id_slot, ids)
    slot.cache_salt = req.cache_salt
    slot.params = generation_settings(sp, _defaults(state), state.context_len, extra)
    obj = GenerateReqInput(
        input_ids=ids,
        sampling_params=sp,
        rid=uuid.uuid4().hex,
        stream=req.stream,
        return_logprob=req.n_probs > 0,
        top_logprobs_num=req.n_probs,
        cache_salt=req.cache_salt,
    )
    job = _Completion(state, req, ids, slot)
    try:
        gen = tm.generate_request(obj, admit=admit_to_queue(state))
        first = await run_until_disconnect(request, gen.__anext__())
    except ValueError as e:
        slot.is_processing = False
        raise HTTPError(400, str(e)) from None
    except BaseException:
        slot.is_processing = False
        raise
    if req.stream:
        return StreamingResponse(job.stream(gen, first), media_type="text/event-stream")
    out = first
    try:
        async for out in gen:  # noqa: B007 (not streamed: the last item is the answer)
            pass
    finally:
        await gen.aclose()
        job.done(out)
    observe(state, out)
    return job.final(out, out["text"], out["output_ids"], 0)


def _model(state: ServerState, req: CompletionRequest) -> str:
    return req.model or served_model_name(state.server_args, state.scheduler_info)


class _Completion:
    """One /completion request's answers in llama-server's shapes."""

    def __init__(self, state: ServerState, req: CompletionRequest, ids: list[int], slot: Slot):
        self.state, self.req, self.ids, self.slot = state, req, ids, slot
        self.tok = state.tokenizer_manager.tokenizer

    def done(self, out: dict | None) -> None:
        self.slot.is_processing = False
        if out is not None:
            self.slot.n_decoded = out["meta_info"].get("completion_tokens", 0)
            self.slot.has_new_line = "\n" in out.get("text", "")

    def _entry(self, lp: float, tid: int) -> dict:
        text = self.tok.decode([tid])
        return {
            "id": tid,
            "token": text,
            "bytes": list(text.encode("utf-8")),
            "logprob": FLOAT_LOWEST if lp is None or lp == float("-inf") else lp,
        }

    def probs(self, meta: dict, start: int) -> list[dict]:
        """completion_probabilities of output tokens start..: each with its top n_probs."""
        chosen = meta.get("output_token_logprobs") or []
        tops = meta.get("output_top_logprobs") or []
        out = []
        for i in range(start, len(chosen)):
            lp, tid, _ = chosen[i]
            top = tops[i] if i < len(tops) and tops[i] is not None else []
            entries = [self._entry(a, b) for a, b, _ in top]
            out.append({**self._entry(lp, tid), "top_logprobs": entries})
        return out

    def timings(self, meta: dict) -> dict:
        e2e = meta.get("e2e_latency", 0.0)
        ttft = min(meta.get("ttft", e2e), e2e)
        cached = meta.get("cached_tokens", 0)
        prompt_n, predicted_n = meta["prompt_tokens"] - cached, meta["completion_tokens"]
        prompt_ms, predicted_ms = ttft * 1000, (e2e - ttft) * 1000

        def rate(n: int, ms: float) -> tuple[float, float]:
            return (ms / n if n else 0.0), (1000 * n / ms if ms > 0 else 0.0)

        p_tok, p_sec = rate(prompt_n, prompt_ms)
        g_tok, g_sec = rate(predicted_n, predicted_ms)
        return {
            "cache_n": cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": p_tok,
            "prompt_per_second": p_sec,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": g_tok,
            "predicted_per_second": g_sec,
        }

    def final(self, out: dict, content: str, tokens: list[int], probs_from: int) -> dict:
        meta = out["meta_info"]
        shown = tokens if self.req.return_tokens or self.req.stream else []
        res = {
            **finished_fields(
                self.ids, out, content, shown, self.tok.decode(self.ids), self.state.context_len
            ),
            "id_slot": self.slot.id,
            "model": _model(self.state, self.req),
            "generation_settings": self.slot.params,
            "has_new_line": "\n" in out["text"],
            "timings": self.timings(meta),
        }
        if self.req.n_probs and len(meta.get("output_token_logprobs") or []) > probs_from:
            res["completion_probabilities"] = self.probs(meta, probs_from)
        return res

    async def stream(self, gen: AsyncIterator, first: dict) -> AsyncIterator[bytes]:
        """llama-server's events: `data: {...}` per new text, the last one the whole answer with
        stop: true (no [DONE], as llama-server's /completion)."""
        text_sent = ids_sent = 0
        out: dict | None = first
        last = first
        try:
            while out is not None:
                last = out
                text, ids, meta = out["text"], out["output_ids"], out["meta_info"]
                if meta["finish_reason"] is not None:
                    observe(self.state, out)
                    yield sse(self.final(out, text[text_sent:], ids[ids_sent:], ids_sent))
                    return
                if len(text) > text_sent or len(ids) > ids_sent:
                    event = {
                        "index": 0,
                        "content": text[text_sent:],
                        "tokens": ids[ids_sent:],
                        "stop": False,
                        "id_slot": self.slot.id,
                        "tokens_predicted": meta.get("completion_tokens", len(ids)),
                        "tokens_evaluated": meta.get("prompt_tokens", len(self.ids)),
                    }
                    if self.req.n_probs:
                        event["completion_probabilities"] = self.probs(meta, ids_sent)
                    yield sse(event)
                text_sent, ids_sent = len(text), len(ids)
                out = await anext(gen, None)
        except STREAM_ERRORS as e:  # the stream started: errors are events, as on the other routes
            yield stream_error_event(e)
        finally:
            self.done(last)
            await gen.aclose()


# ------------------------------------------------------------------ /props and /slots
@router.get("/props")
async def props(request: Request):
    state = srv(request)
    table = slot_table(request)
    ctx = state.context_len
    settings = generation_settings(
        {"max_new_tokens": -1 + ctx}, _defaults(state), ctx, {"stream": False, "n_probs": 0}
    )
    settings["n_predict"] = -1  # up to the end of the context
    idle = Slot(0).to_json(ctx)
    return {
        "default_generation_settings": {**idle, "params": settings, "prompt": ""},
        "total_slots": len(table.slots),
        "model_path": state.scheduler_info["model_path"],
        "model_alias": served_model_name(state.server_args, state.scheduler_info),
        "chat_template": getattr(state.tokenizer_manager.tokenizer, "chat_template", None) or "",
        "chat_template_caps": {},
        "modalities": {"vision": "image" in (state.scheduler_info.get("modalities") or [])},
        "build_info": f"radixlm {__version__}",
        "is_sleeping": False,
    }


@router.get("/slots")
async def slots(request: Request, fail_on_no_slot: int = 0):
    table, ctx = slot_table(request), srv(request).context_len
    if fail_on_no_slot and all(s.is_processing for s in table.slots):
        raise HTTPError(503, "no slot available", "unavailable_error")
    return [s.to_json(ctx) for s in table.slots]


@router.post(
    "/slots/{id_slot}",
    openapi_extra=json_body({"type": "object", "properties": {"filename": {"type": "string"}}}),
)
async def slot_action(request: Request, id_slot: int, action: str = ""):
    """save / restore a slot's cached prompt to / from a file under --slot-save-path; erase
    forgets it. Admin only: it writes and reads files on the server."""
    if role_of(request) < Role.ADMIN:
        raise HTTPError(403, admin_refusal(access_of(request.app)), "permission_error")
    state = srv(request)
    slot = slot_table(request).get(id_slot)
    if action == "erase":
        n, slot.prompt_ids = len(slot.prompt_ids), []
        return {"id_slot": id_slot, "n_erased": n}
    if action not in ("save", "restore"):
        raise HTTPError(400, "action must be save, restore or erase", param="action")
    args = state.server_args
    if args.tp_size > 1 or args.pp_size > 1 or args.enable_dp_attention:
        raise HTTPError(
            501,
            "slot files are served by a single-rank scheduler only (no --tp/--pp/--dp-attention)",
            "not_supported_error",
        )
    body = await read_json(request)
    filename = body.get("filename") if isinstance(body, dict) else None
    path = slot_file_path(args.slot_save_path, filename)
    started = time.perf_counter()
    if action == "save":
        if not slot.prompt_ids:
            raise HTTPError(400, f"slot {id_slot} has no prompt to save", param="id_slot")
        msg = SlotSaveReq(path, list(slot.prompt_ids), cache_namespace(slot.cache_salt))
    else:
        if not os.path.isfile(path):
            raise HTTPError(404, f"no slot file {filename!r}", "not_found_error", "filename")
        msg = SlotRestoreReq(path)
    reply = await state.tokenizer_manager.control.call(msg, SlotFileReqOutput)
    if not reply.success:
        raise HTTPError(400, reply.message, param="filename")
    ms = (time.perf_counter() - started) * 1000
    if action == "save":
        return {
            "id_slot": id_slot,
            "filename": filename,
            "n_saved": reply.n_tokens,
            "n_written": reply.n_bytes,
            "timings": {"save_ms": ms},
        }
    slot.prompt_ids = reply.token_ids or []
    return {
        "id_slot": id_slot,
        "filename": filename,
        "n_restored": reply.n_tokens,
        "n_read": reply.n_bytes,
        "timings": {"restore_ms": ms},
    }


# ------------------------------------------------------------ /tokenize in llama-server's shape
def _piece(tok, tid: int):
    """A token's text, or its bytes (a list of ints) where they are not whole UTF-8 characters
    (llama-server's with_pieces): byte-level BPE pieces are mapped back to their bytes."""
    text = tok.decode([tid])
    if "\ufffd" not in text:
        return text
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    raw = tok.convert_ids_to_tokens(tid)
    if isinstance(raw, str) and raw and all(c in byte_of for c in raw):
        data = bytes(byte_of[c] for c in raw)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return list(data)
    return text


async def llama_tokenize(state: ServerState, body: dict) -> dict:
    """POST /tokenize {content, add_special, parse_special, with_pieces} -> {tokens}."""
    content = body.get("content")
    flags = {k: body.get(k, d) for k, d in (("add_special", False), ("parse_special", True))}
    flags["with_pieces"] = body.get("with_pieces", False)
    if not isinstance(content, str):
        raise HTTPError(400, "content must be a string", param="content")
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise HTTPError(400, f"{k} must be a boolean", param=k)
    unknown = sorted(set(body) - {"content", *flags})
    if unknown:
        raise HTTPError(400, f"unknown field(s): {', '.join(unknown)}", param=unknown[0])
    tm = state.tokenizer_manager
    tok = tm.tokenizer
    if len(content) > state.context_len * tm.max_token_chars:
        raise HTTPError(400, "content is far longer than the context length", param="content")

    def run() -> list:
        ids = tok.encode(
            content,
            add_special_tokens=flags["add_special"],
            split_special_tokens=not flags["parse_special"],
        )
        if not flags["with_pieces"]:
            return ids
        return [{"id": t, "piece": _piece(tok, t)} for t in ids]

    return {"tokens": await tm.tokenizer_pool.run(run, what="tokenizing the content")}
