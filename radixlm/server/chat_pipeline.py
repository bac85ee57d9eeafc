"""The chat and completions pipelines every API's routes share: a parsed OpenAI request becomes
one native GenerateReqInput (all prompts, n copies each; for a chat, its messages rendered with the
chat template, its tools, images and thinking), its outputs OpenAI's bodies or chunks
(openai_job.py). OpenAI's routes (openai_api.py) answer with them; Anthropic's Messages, OpenAI's
Responses and Ollama's routes translate their request into a ChatCompletionRequest (or a
CompletionRequest) and shape what open_chat (open_completion) returns.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from radixlm.ipc import GenerateReqInput
from radixlm.server.api_common import (
    HTTPError,
    ServerState,
    observe,
    run_until_disconnect,
    srv,
)
from radixlm.server.chat_images import chat_images
from radixlm.server.chat_render import chat_stop, render_chat
from radixlm.server.chat_tools import output_spec, plan_tools
from radixlm.server.fanout import admit_to_queue, check_fanout
from radixlm.server.fim import fim_prompt_ids
from radixlm.server.model_names import requested_model
from radixlm.server.openai_job import Job, Sent, stream_chunks
from radixlm.server.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    response_format_constraint,
)
from radixlm.server.sampling_builder import ClientNames, build_sampling_params
from radixlm.server.thinking_params import thinking_params
from radixlm.server.tool_template import tool_setup

# Request fields copied verbatim into sampling_params when given (the same names).
_SAMPLING_FIELDS = {
    name: name
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "regex",
        "json_schema",
        "ebnf",
        "structural_tag",
        "stop_regex",
        "logit_bias",
        "typical_p",
        "bad_words",
        "allowed_token_ids",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "xtc_probability",
        "xtc_threshold",
    )
}


def _sampling_params(
    state: ServerState, req, max_new_tokens: int, max_field: str, prompt_len: int
) -> dict:
    limits = state.server_args
    room = state.context_len - prompt_len
    if (
        max_new_tokens > room
    ):  # named here as the client sent it (the engine would say max_new_tokens)
        got = (
            str(max_new_tokens)
            if max_new_tokens < 10**12
            else f"a {len(str(max_new_tokens))}-digit number"
        )
        raise HTTPError(
            400,
            f"{max_field} must be at most {room} (the context length {state.context_len} minus the "
            f"prompt's {prompt_len} tokens), got {got}",
            param=max_field,
        )
    if req.n is not None and req.n > limits.max_n:
        raise HTTPError(400, f"n must be <= {limits.max_n} (--max-n), got {req.n}", param="n")
    field = "top_logprobs" if isinstance(req, ChatCompletionRequest) else "logprobs"
    top = getattr(req, field)
    if top is not None and top > limits.max_top_logprobs_num:
        raise HTTPError(
            400,
            f"{field} must be <= {limits.max_top_logprobs_num} (--max-top-logprobs-num), got {top}",
            param=field,
        )
    if req.stream_options is not None and not req.stream:
        raise HTTPError(
            400, "stream_options is only allowed when stream is true", param="stream_options"
        )
    if req.return_token_ids and req.stream:
        raise HTTPError(
            400, "return_token_ids is supported without stream only", param="return_token_ids"
        )
    return build_sampling_params(
        req,
        _SAMPLING_FIELDS,
        state.scheduler_info["vocab_size"],
        ClientNames({"max_new_tokens": max_field, "min_new_tokens": "min_tokens"}, every_name=True),
        first={"max_new_tokens": max_new_tokens, "n": req.n or 1},
        then={} if req.min_tokens is None else {"min_new_tokens": req.min_tokens},
    )


def _check_length(state: ServerState, prompts: list[list[int]], field: str) -> None:
    ctx = state.scheduler_info["context_len"]
    for p in prompts:
        if len(p) >= ctx:
            raise HTTPError(
                400,
                f"the {field} has {len(p)} tokens; this model's context length is {ctx} "
                "(prompt + completion), so it must be shorter",
                param=field,
            )


async def _open(request: Request, job: Job):
    """Start the job: its response body (a dict), or, streaming, an async iterator of chunk bodies.
    A stream waits for its first output first, so that an error the engine finds (a bad prompt, a
    grammar that does not compile) is still a proper 4xx; later errors raise from the iterator
    (ValueError, EngineDeadError, InternalRequestError) for the caller to shape."""
    state = srv(request)
    gen = state.tokenizer_manager.generate_request(job.obj, admit=admit_to_queue(state))
    try:
        if job.obj.stream:
            first = await run_until_disconnect(request, gen.__anext__())
            return _chunks(state, job, gen, first)
        out = await run_until_disconnect(request, _last(gen))
    except ValueError as e:
        raise HTTPError(400, str(e)) from None
    observe(state, out)
    outs = out if isinstance(out, list) else [out]
    extra = (
        {"prompt_token_ids": job.prompt_ids[0]} if job.chat and job.prompt_ids is not None else {}
    )
    return job.body(
        [job.choice(i, o) for i, o in enumerate(outs)],
        usage=job.usage(outs),
        system_fingerprint=None,
        **extra,
    )


async def _chunks(
    state: ServerState, job: Job, gen: AsyncIterator, first: dict
) -> AsyncIterator[dict]:
    sent: dict[int, Sent] = {}
    finals: dict[int, dict] = {}
    try:
        out = first
        while out is not None:
            idx = out.get("index", 0)
            for chunk in stream_chunks(job, idx, out, sent.setdefault(idx, Sent())):
                yield chunk
            if out["meta_info"]["finish_reason"] is not None:
                finals[idx] = out
                observe(state, out)
            out = await anext(gen, None)
        if job.include_usage:
            yield job.body([], usage=job.usage([finals[i] for i in sorted(finals)]))
    finally:
        # Closing the native generator aborts whatever still runs (client gone, error). A
        # cancellation (disconnect) is not caught, so it propagates after this.
        await gen.aclose()


# ------------------------------------------------------------ completions
async def open_completion(request: Request, req: CompletionRequest):
    """The completions pipeline for a parsed request, as open_chat is the chat one (Ollama's raw
    and fill-in-the-middle /api/generate run through it)."""
    state = srv(request)
    requested = requested_model(state, req.model)
    model = requested.name
    if req.suffix and req.echo:
        raise HTTPError(400, "echo cannot be combined with suffix", param="echo")
    n = req.n or 1
    if req.best_of is not None and req.best_of != n:
        raise HTTPError(
            400,
            f"best_of must equal n ({n}); choosing the best of several is not supported",
            param="best_of",
        )
    tm = state.tokenizer_manager
    tok = tm.tokenizer
    p = req.prompt
    texts = [p] if isinstance(p, str) else p if isinstance(p[0], str) else None
    prompts = 1 if isinstance(p, str) or isinstance(p[0], int) else len(p)
    check_fanout(state, prompts * n, prompts, "prompt")  # before tokenizing any of them
    try:
        if req.suffix:  # fill-in-the-middle: the prompt is the prefix (server/fim.py)
            ids = await fim_prompt_ids(state, p, req.suffix)
        else:
            ids = (
                await tm.tokenizer_pool.run(
                    lambda: [tm.encode_prompt(t) for t in texts], what="tokenizing the prompt"
                )
                if texts
                else [p]
                if isinstance(p[0], int)
                else p
            )
    except ValueError as e:
        raise HTTPError(400, str(e), param="prompt") from None
    if texts is not None and not all(ids):
        raise HTTPError(400, "the prompt is empty", param="prompt")
    _check_length(state, ids, "prompt")
    max_tokens = 16 if req.max_tokens is None else req.max_tokens  # OpenAI's default
    sp = _sampling_params(state, req, max_tokens, "max_tokens", max(len(i) for i in ids))
    single = len(ids) == 1 and (isinstance(p, str) or isinstance(p[0], int))
    rid = uuid.uuid4().hex
    want_lp = req.logprobs is not None
    obj = GenerateReqInput(
        input_ids=ids[0] if single else ids,
        sampling_params=sp,
        rid=rid if single else [f"{rid}-{i}" for i in range(len(ids))],
        return_logprob=want_lp,
        logprob_start_len=0 if want_lp and req.echo else -1,
        top_logprobs_num=req.logprobs or 0,
        return_text_in_logprobs=True,
        stream=bool(req.stream),
        cache_salt=req.cache_salt,
        lora_path=requested.adapter,
        bootstrap_host=req.bootstrap_host,
        bootstrap_port=req.bootstrap_port,
        bootstrap_room=req.bootstrap_room,
    )
    echo = (texts or [tok.decode(i) for i in ids]) if req.echo else None
    job = Job(
        chat=False,
        id=f"cmpl-{rid}",
        model=model,
        n=n,
        obj=obj,
        echo_texts=echo,
        logprobs=want_lp,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        prompt_ids=ids if req.return_token_ids else None,
    )
    return await _open(request, job)


# -------------------------------------------------------- chat completions
async def open_chat(
    request: Request,
    req: ChatCompletionRequest,
    prompt_prefix: list[int] | None = None,
    token_ids: bool = False,
):
    """The chat pipeline for a parsed request: the chat.completion body (a dict), or, streaming, an
    async iterator of chat.completion.chunk bodies (see _open). Other APIs' routes (Anthropic's
    Messages, OpenAI's Responses, Ollama's) translate their request into a ChatCompletionRequest
    and shape what this returns. For Ollama's generate `context`: prompt_prefix, token ids put
    before the rendered prompt; token_ids, the prompt's and the output's ids in the answer (a
    stream's in its finishing chunk)."""
    state = srv(request)
    requested = requested_model(state, req.model)
    model = requested.name
    if req.top_logprobs is not None and not req.logprobs:
        raise HTTPError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
    try:
        constraint = response_format_constraint(req.response_format)
    except RequestError as e:
        raise HTTPError(400, str(e), param=e.param) from None
    if constraint is not None:
        if req.regex or req.json_schema or req.ebnf or req.structural_tag:
            raise HTTPError(
                400,
                "response_format cannot be combined with regex, json_schema, ebnf or "
                "structural_tag",
                param="response_format",
            )
        setattr(req, *constraint)
    tok = state.tokenizer_manager.tokenizer
    plan = plan_tools(
        req, tool_setup(tok, state.server_args.tool_call_parser)
    )  # sets req's tool constraint
    check_fanout(state, req.n or 1, 1, "messages")
    images = await chat_images(state, req, plan)  # None: text only
    ids = (
        images.ids
        if images
        else await state.tokenizer_manager.tokenizer_pool.run(
            render_chat, state, req, plan, what="rendering the chat template"
        )
    )
    if prompt_prefix:
        if images:
            raise HTTPError(400, "context cannot be combined with images", param="context")
        ids = [*prompt_prefix, *ids]
    _check_length(state, [ids], "messages")
    ctx = state.scheduler_info["context_len"]
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    # No limit given: up to the end of the context, as vLLM and OpenAI do.
    sp = _sampling_params(
        state, req, ctx - len(ids) if max_tokens is None else max_tokens, field, len(ids)
    )
    sp.update(thinking_params(state, req))  # the think block and its budget (--reasoning-parser)
    if chat_stop(state):  # a conversation template's stop strings join the request's, as in SGLang
        given = sp.get("stop") or []
        sp["stop"] = [*([given] if isinstance(given, str) else given), *chat_stop(state)]
    rid = uuid.uuid4().hex
    obj = GenerateReqInput(
        input_ids=None if images else ids,
        text=images.text if images else None,
        image_data=images.urls if images else None,
        sampling_params=sp,
        rid=rid,
        return_logprob=bool(req.logprobs),
        top_logprobs_num=req.top_logprobs or 0,
        return_text_in_logprobs=True,
        stream=bool(req.stream),
        cache_salt=req.cache_salt,
        lora_path=requested.adapter,
        bootstrap_host=req.bootstrap_host,
        bootstrap_port=req.bootstrap_port,
        bootstrap_room=req.bootstrap_room,
    )
    if images:
        images.attach(obj)
    job = Job(
        chat=True,
        id=f"chatcmpl-{rid}",
        model=model,
        n=req.n or 1,
        obj=obj,
        logprobs=bool(req.logprobs),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        prompt_ids=[ids] if req.return_token_ids or token_ids else None,
        output=output_spec(req, plan, state.server_args.reasoning_parser, tok.chat_template),
    )
    return await _open(request, job)


async def _last(gen: AsyncIterator):
    out = None
    async for out in gen:  # noqa: B007 (the last item is the result)
        pass
    return out
