"""TokenizerManager: validates and tokenizes requests, sends them to the scheduler, and
turns the detokenizer's chunks into response dicts. Runs on one asyncio loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from radixlm.config import PortArgs, ServerArgs
from radixlm.disaggregation.config import parse_bootstrap
from radixlm.engine.lora_control import LoRAControlMixin, cache_namespace
from radixlm.engine.media import MediaConfig
from radixlm.engine.mm_processor import multimodal_prompt
from radixlm.engine.req_state import ReqState
from radixlm.engine.request_sampling import RequestSampling
from radixlm.engine.rl_control import RLControlMixin
from radixlm.engine.tokenizer_pool import TokenizerPool
from radixlm.ipc import (
    AbortReq,
    BatchStrOut,
    ControlFailed,
    FinishAbort,
    FinishReason,
    FlushCacheReq,
    FlushCacheReqOutput,
    GenerateReqInput,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    ReqStrChunk,
    TokenizedGenerateReqInput,
)
from radixlm.sampling_params import SamplingParams, brief_repr

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    pass


class InternalRequestError(RuntimeError):
    """The engine failed this request (an abort with a status >= 500). The client gets this generic
    message with the request id; the details are in the server log only."""

    def __init__(self, rid: str):
        super().__init__(f"internal error (request id {rid}); the details are in the server log")
        self.rid = rid


def is_internal_failure(reason: FinishReason | None) -> bool:
    return isinstance(reason, FinishAbort) and (reason.status_code or 0) >= 500


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MAX_CACHE_SALT_CHARS = 1024


@dataclass(frozen=True)
class TokenizerManagerConfig:
    max_n: int = 128  # largest n a request may ask for
    max_top_logprobs_num: int = 20
    # Prefill a prompt that a batch repeats once first, so the copies share it (off without a prefix
    # cache).
    cache_shared_prompts: bool = True
    # Seconds a request's tokenization may take on the tokenizer threads (tokenizer_pool.py).
    tokenizer_timeout: float = 30.0
    # Requests' `priority` reaches the scheduler only with --enable-priority-scheduling (else it is
    # ignored, as SGLang does): otherwise any client could put itself ahead of every other.
    enable_priority_scheduling: bool = False
    media: MediaConfig = (
        MediaConfig()
    )  # images in requests: sources, size and pixel bounds (engine/media.py)
    disaggregation_mode: str = (
        "null"  # PD disaggregation: which requests may carry bootstrap fields
    )

    def __post_init__(self):
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n}")
        if not self.tokenizer_timeout > 0:
            raise ValueError(f"tokenizer_timeout must be > 0, got {self.tokenizer_timeout}")
        if self.max_top_logprobs_num < 0:
            raise ValueError(f"max_top_logprobs_num must be >= 0, got {self.max_top_logprobs_num}")

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> TokenizerManagerConfig:
        return cls(
            args.max_n,
            args.max_top_logprobs_num,
            not args.disable_radix_cache,
            tokenizer_timeout=args.tokenizer_timeout,
            enable_priority_scheduling=args.enable_priority_scheduling,
            media=MediaConfig.from_server_args(args),
            disaggregation_mode=args.disaggregation_mode,
        )


class TokenizerManager(RLControlMixin, LoRAControlMixin):
    def __init__(
        self, config: TokenizerManagerConfig, port_args: PortArgs, tokenizer, scheduler_info: dict
    ):
        self.config = config
        self.port_args = port_args
        self.tokenizer = tokenizer
        self.context_len = scheduler_info["context_len"]
        self.vocab_size = scheduler_info["vocab_size"]
        self.scheduler_info = scheduler_info
        self.sampling = RequestSampling.from_info(tokenizer, scheduler_info)
        self.rid_to_state: dict[str, ReqState] = {}
        self._control_waiters: dict[type, list[asyncio.Future]] = {}
        self._control_sent: dict[
            asyncio.Future, float
        ] = {}  # control calls in flight: when each was sent
        self.dead_message: str | None = None
        self.loop_failure: str | None = (
            None  # the receive loop failed: the engine must go (the watchdog reads it)
        )
        # Characters of text one token can cover at most (its byte-level / piece form is no
        # shorter).
        self.max_token_chars = max((len(t) for t in tokenizer.get_vocab()), default=1) + 1
        # Tokenization and chat templates run there, off the event loop.
        self.tokenizer_pool = TokenizerPool(config.tokenizer_timeout)

    async def start(self) -> None:
        """Create the sockets and the receive loop on the running event loop."""
        ctx = zmq.asyncio.Context(2)
        self.recv_from_detokenizer = ctx.socket(zmq.PULL)
        self.recv_from_detokenizer.bind(self.port_args.tokenizer_ipc_name)
        self.send_to_scheduler = ctx.socket(zmq.PUSH)
        self.send_to_scheduler.connect(self.port_args.scheduler_input_ipc_name)
        self._loop_task = asyncio.get_running_loop().create_task(self.handle_loop())

    # ----------------------------------------------------------- validation
    def tokenize_one(self, obj: GenerateReqInput, i: int) -> tuple[TokenizedGenerateReqInput, int]:
        text, mm = obj.text if obj.is_single or obj.text is None else obj.text[i], None
        if obj.input_ids is not None:
            ids = obj.input_ids if obj.is_single else obj.input_ids[i]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                raise ValueError("input_ids must be a list of integers (or a list of such lists)")
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"input_ids has token id {bad[0]} outside the vocabulary [0, {self.vocab_size})"
                )
        else:
            if not isinstance(text, str):
                raise ValueError("text must be a string or a list of strings")
            ids, mm = multimodal_prompt(self, obj, i, text) or (self.encode_prompt(text), None)
        if not ids:
            raise ValueError("the prompt is empty (text / input_ids)")
        if len(ids) >= self.context_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, which does not fit the context length"
                f" {self.context_len}"
            )
        sp = self.sampling.params(
            obj.item(i, "sampling_params")
        )  # the defaults under it, validated
        if len(ids) + sp.max_new_tokens > self.context_len:
            raise ValueError(
                f"sampling_params.max_new_tokens {brief_repr(sp.max_new_tokens)} plus the prompt's"
                f" {len(ids)} tokens exceed the context length {self.context_len}; ask for at most"
                f" {self.context_len - len(ids)}"
            )
        if sp.n > self.config.max_n:
            raise ValueError(
                f"sampling_params.n must be <= {self.config.max_n} (--max-n), got"
                f" {brief_repr(sp.n)}"
            )
        rid = obj.item(i, "rid") or uuid.uuid4().hex
        lp_start = obj.item(i, "logprob_start_len", -1)
        top_n = obj.item(i, "top_logprobs_num", 0)
        return_logprob = obj.item(i, "return_logprob", False)
        priority = obj.item(i, "priority")
        salt, lora_id = obj.item(i, "cache_salt"), self.resolve_lora(obj.item(i, "lora_path"))
        if not isinstance(rid, str):
            raise ValueError(
                f"rid must be a string (a list of them for a batch), got {brief_repr(rid)}"
            )
        if not isinstance(return_logprob, bool):
            raise ValueError(
                "return_logprob must be a boolean (a list of them for a batch), got"
                f" {brief_repr(return_logprob)}"
            )
        if not _is_int(lp_start) or lp_start < -1:
            raise ValueError(
                f"logprob_start_len must be an integer >= -1, got {brief_repr(lp_start)}"
            )
        if return_logprob and lp_start >= len(ids):
            raise ValueError(
                f"logprob_start_len {lp_start} must be below the prompt length {len(ids)}"
            )
        if (
            mm is not None and return_logprob and 0 <= lp_start < mm.last_end
        ):  # an image token has no logprob
            raise ValueError(
                f"logprob_start_len must be -1 or >= {mm.last_end} (after the last image) with"
                " image_data"
            )
        if not _is_int(top_n) or not 0 <= top_n <= self.config.max_top_logprobs_num:
            raise ValueError(
                f"top_logprobs_num must be an integer in [0, {self.config.max_top_logprobs_num}] "
                f"(--max-top-logprobs-num), got {brief_repr(top_n)}"
            )
        # The scheduler sorts its queue by priority: anything but an integer would kill it there.
        if priority is not None and not _is_int(priority):
            raise ValueError(
                "priority must be an integer (a list of them for a batch), got"
                f" {brief_repr(priority)}"
            )
        if salt is not None and not (
            isinstance(salt, str) and 0 < len(salt) <= MAX_CACHE_SALT_CHARS
        ):
            raise ValueError(
                f"cache_salt must be a non-empty string of at most {MAX_CACHE_SALT_CHARS}"
                f" characters (a list of them for a batch), got {brief_repr(salt)}"
            )
        req = TokenizedGenerateReqInput(
            rid=rid,
            input_text=text,
            input_ids=ids,
            sampling_params=sp,
            return_logprob=return_logprob,
            logprob_start_len=lp_start,
            top_logprobs_num=top_n,
            stream=obj.stream,
            priority=priority if self.config.enable_priority_scheduling else None,
            cache_namespace=self.lora_namespace(lora_id, cache_namespace(salt)),
            lora_id=lora_id,
            mm_inputs=mm,
            bootstrap=parse_bootstrap(
                obj.item(i, "bootstrap_host"),
                obj.item(i, "bootstrap_port"),
                obj.item(i, "bootstrap_room"),
                self.config.disaggregation_mode,
                sp.n,
            ),
        )
        return req, sp.n

    def encode_prompt(self, text: str) -> list[int]:
        """Tokenize, refusing a text longer than the context before tokenizing all of it: no token
        spans more than max_token_chars characters, and a prefix with more tokens than the context
        already decides it."""
        ctx = self.context_len
        if len(text) > ctx * self.max_token_chars:
            raise ValueError(
                f"the prompt has {len(text)} characters, more than the context length {ctx} tokens "
                "can hold"
            )
        probe = ctx * 8
        if len(text) > probe and len(self.tokenizer.encode(text[:probe])) > ctx + 1:
            raise ValueError(
                f"the prompt has more tokens than the context length {ctx} "
                f"(its first {probe} characters alone do)"
            )
        return self.tokenizer.encode(text)

    def expand(self, obj: GenerateReqInput) -> list[TokenizedGenerateReqInput]:
        """All requests of obj, each n-sampled one split into n copies (seed offset per copy)."""
        out = []
        for i in range(obj.batch_size):
            req, n = self.tokenize_one(obj, i)
            if n == 1:
                out.append(req)
                continue
            for j in range(n):
                sp = dataclasses.replace(req.sampling_params, n=1)
                if sp.seed is not None:
                    sp.seed += j
                out.append(dataclasses.replace(req, rid=f"{req.rid}-{j}", sampling_params=sp))
        return out

    # --------------------------------------------------------------- generate
    async def generate_request(
        self, obj: GenerateReqInput, admit: Callable[[int], None] | None = None
    ) -> AsyncIterator[Any]:
        """Yields response dicts: for a single request with n == 1 one dict per update (the
        final one when not streaming); otherwise a list (or, streaming, dicts with "index").
        admit(number of requests) may refuse them (by raising) right before they are registered,
        with no await in between: a queue limit counted there holds however many calls race."""
        self._check_alive()
        reqs = await self.tokenizer_pool.run(self.expand, obj)
        self._check_alive()
        if admit is not None:
            admit(len(reqs))
        single = obj.is_single and len(reqs) == 1
        states: list[ReqState] = []
        tasks: list[asyncio.Task] = []
        try:
            for (
                r
            ) in reqs:  # inside the try: a rid already in use must not leave the others registered
                states.append(self._register(r, obj.return_text_in_logprobs))
            if len(reqs) > 1 and not obj.stream:
                await self._cache_shared_prompts(reqs)
            for r in reqs:
                self.send_to_scheduler.send_pyobj(r)
            if single:
                async for out in self._wait_one(states[0], obj.stream):
                    yield out
            elif obj.stream:
                queue: asyncio.Queue = asyncio.Queue()

                async def pump(idx: int, st: ReqState):
                    try:
                        async for out in self._wait_one(st, True):
                            out["index"] = idx
                            await queue.put(out)
                    except Exception as e:
                        await queue.put(
                            e
                        )  # (not raised in this task, where nobody would see it: the loop waits)
                        return
                    await queue.put(None)

                tasks = [asyncio.create_task(pump(i, st)) for i, st in enumerate(states)]
                done = 0
                while done < len(tasks):
                    item = await queue.get()
                    if item is None:
                        done += 1
                    elif isinstance(item, Exception):
                        raise item
                    else:
                        yield item
            else:
                # Tasks, so that the finally below cancels the others when one fails (left pending,
                # they would wait forever on requests already aborted).
                tasks = [asyncio.create_task(self._last(st)) for st in states]
                results = await asyncio.gather(*tasks)
                yield results
        finally:
            for t in tasks:
                t.cancel()
            for st in states:
                # An internal failure may come from past the scheduler (the detokenizer): stop it
                # there too.
                if st.finished_reason is None or is_internal_failure(st.finished_reason):
                    self.abort_request(st.rid)
                self.rid_to_state.pop(st.rid, None)

    async def _cache_shared_prompts(self, reqs: list[TokenizedGenerateReqInput]) -> None:
        """n > 1 (or a batch repeating a prompt): prefill each distinct prompt once first, so the
        copies share its KV through the radix cache instead of computing it in parallel."""
        if not self.config.cache_shared_prompts:
            return
        seen, warm = set(), []
        for r in reqs:
            key = (
                tuple(r.input_ids),
                r.cache_namespace,
                r.lora_id,
                r.mm_inputs,
            )  # its namespace, adapter, images
            if key in seen and len(key[0]) > 1:
                warm.append(key)
            seen.add(key)
        if not warm:
            return
        prefill = [
            TokenizedGenerateReqInput(
                rid=uuid.uuid4().hex,
                input_text=None,
                input_ids=list(ids),
                sampling_params=SamplingParams(max_new_tokens=0),
                cache_namespace=ns,
                lora_id=lora,
                mm_inputs=mm,
            )
            for ids, ns, lora, mm in dict.fromkeys(warm)
        ]
        states = [self._register(p, False) for p in prefill]
        try:
            for p in prefill:
                self.send_to_scheduler.send_pyobj(p)
            await asyncio.gather(*[self._last(st) for st in states])
        finally:
            for st in states:
                self.rid_to_state.pop(st.rid, None)

    def _register(self, r: TokenizedGenerateReqInput, text_in_logprobs: bool) -> ReqState:
        if r.rid in self.rid_to_state:
            raise ValueError(f"rid {r.rid!r} is already in use")
        st = ReqState(
            rid=r.rid,
            prompt_text=r.input_text,
            return_text_in_logprobs=text_in_logprobs,
            lora_id=r.lora_id,
        )
        self.rid_to_state[r.rid] = st
        return st

    async def _last(self, st: ReqState) -> dict:
        out = None
        async for out in self._wait_one(st, False):  # noqa: B007 (the last item is the result)
            pass
        return out

    async def _wait_one(self, st: ReqState, stream: bool) -> AsyncIterator[dict]:
        while True:
            await st.event.wait()
            st.event.clear()
            self._check_alive()
            if st.finished_reason is not None:
                fr = st.finished_reason
                if isinstance(fr, FinishAbort) and fr.status_code == 400:
                    raise ValueError(fr.message)
                if is_internal_failure(fr):
                    logger.error("request %s failed: %s", st.rid, fr.message)
                    raise InternalRequestError(st.rid)
                yield self._response(st)
                return
            if stream and st.dirty:
                st.dirty = False
                yield self._response(st)

    def _response(self, st: ReqState) -> dict:
        meta = {
            "id": st.rid,
            # The edge: SGLang's JSON (an abort's HTTP status stays inside).
            "finish_reason": (
                st.finished_reason.to_json() if st.finished_reason is not None else None
            ),
            **st.meta,
            "e2e_latency": time.perf_counter() - st.created,
        }
        for k, v in st.logprobs.items():
            meta[k] = self._with_text(v, st.return_text_in_logprobs, top=k.endswith("top_logprobs"))
        return {"text": st.text, "output_ids": list(st.output_ids), "meta_info": meta}

    def _with_text(self, entries: list, with_text: bool, top: bool) -> list:
        def one(e):
            lp, tid = e
            return (lp, tid, self.tokenizer.decode([tid]) if with_text else None)

        if top:
            return [None if pos is None else [one(e) for e in pos] for pos in entries]
        return [one(e) for e in entries]

    # -------------------------------------------------------------- receive
    async def handle_loop(self) -> None:
        """One chunk that cannot be applied fails its request only; anything else that fails here
        (a message that does not unpickle: whose news was lost is unknown) ends the engine: every
        request fails now, and the watchdog reads loop_failure (restart, or exit non-zero)."""
        try:
            while True:
                self._dispatch(await self.recv_from_detokenizer.recv_pyobj())
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the tokenizer manager's receive loop failed")
            self.loop_failure = "the tokenizer manager's receive loop failed"
            self.mark_dead(self.loop_failure)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, BatchStrOut):
            for c in msg.chunks:
                try:
                    self._on_chunk(c)
                except Exception as e:
                    logger.exception("request %s: its output could not be applied", c.chunk.rid)
                    self._fail(
                        c.chunk.rid, f"internal error: tokenizer manager: {type(e).__name__}: {e}"
                    )
        elif (
            isinstance(msg, ControlFailed) or type(msg) in self._control_waiters
        ):  # any control call's reply
            failed = isinstance(msg, ControlFailed)
            waiters = self._control_waiters.get(msg.reply_type if failed else type(msg), [])
            if waiters:
                fut = waiters.pop(0)
                if not fut.done():
                    if failed:  # the HTTP layer answers a generic 500
                        fut.set_exception(
                            RuntimeError(f"the scheduler failed a {msg.reply_type.__name__} call")
                        )
                    else:
                        fut.set_result(msg)
        else:
            logger.error("unknown message %r", type(msg))

    def _fail(self, rid: str, message: str) -> None:
        st = self.rid_to_state.get(rid)
        if st is not None:
            st.finished_reason = FinishAbort(message, 500)
            st.event.set()

    def _on_chunk(self, sc: ReqStrChunk) -> None:
        c = sc.chunk
        st = self.rid_to_state.get(c.rid)
        if st is None or st.finished_reason is not None:  # a finished request takes no more news
            return
        st.output_ids.extend(c.new_output_ids)
        st.text = sc.text
        st.meta.update(
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
            cached_tokens=c.cached_tokens,
            forward_passes=c.forward_passes,
            spec_verify_ct=c.spec_verify_ct,
            spec_accepted_tokens=c.spec_accepted_tokens,
        )
        if c.first_token_time is not None:
            st.meta["ttft"] = max(0.0, c.first_token_time - st.created_wall)
        for k in (
            "input_token_logprobs",
            "input_top_logprobs",
            "output_token_logprobs",
            "output_top_logprobs",
        ):
            v = getattr(c, k)
            if v is not None:
                st.logprobs.setdefault(k, []).extend(v)
        st.finished_reason = c.finished_reason
        st.dirty = True
        st.event.set()

    async def close(self) -> None:
        self.tokenizer_pool.close()
        self._loop_task.cancel()
        try:
            await self._loop_task
        except (asyncio.CancelledError, Exception):
            pass
        self.recv_from_detokenizer.close(linger=0)
        self.send_to_scheduler.close(linger=0)

    # --------------------------------------------------------------- control
    def abort_request(self, rid: str) -> None:
        if self.dead_message is None:
            self.send_to_scheduler.send_pyobj(AbortReq(rid))

    async def _control(self, req, reply_type: type):
        self._check_alive()
        fut = asyncio.get_running_loop().create_future()
        self._control_waiters.setdefault(reply_type, []).append(fut)
        self._control_sent[fut] = time.perf_counter()
        try:
            self.send_to_scheduler.send_pyobj(req)
            return await fut
        finally:
            self._control_sent.pop(fut, None)

    def pending_age(self) -> float:
        """Seconds the oldest request or control call still waiting on the engine has waited (0:
        none). Read by the watchdog thread: it copies the containers (atomic under the GIL)."""
        sent = [st.created for st in list(self.rid_to_state.values()) if st.finished_reason is None]
        sent += list(self._control_sent.values())
        return time.perf_counter() - min(sent) if sent else 0.0

    async def flush_cache(self, level: str = "l1") -> FlushCacheReqOutput:
        return await self._control(FlushCacheReq(level), FlushCacheReqOutput)

    async def get_internal_state(self) -> dict:
        return (await self._control(GetInternalStateReq(), GetInternalStateReqOutput)).state

    def mark_dead(self, message: str) -> None:
        """A child process died: fail everything in flight instead of hanging."""
        self.dead_message = message
        for st in self.rid_to_state.values():
            st.event.set()
        for waiters in self._control_waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_exception(EngineDeadError(message))

    def _check_alive(self) -> None:
        if self.dead_message is not None:
            raise EngineDeadError(self.dead_message)
