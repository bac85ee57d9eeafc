"""TokenizerManager: validates and tokenizes requests, sends them to the scheduler, and
turns the detokenizer's chunks into response dicts. Runs on one asyncio loop.

Its components, each built here with what it needs: `requests` (request_tokenizer.py: a request
validated and tokenized), `observability` (observability.py: the request log, the crash dump, the
dashboard's recent requests), `control` (control_calls.py: the control calls to the scheduler) and
the calls made of them: `rl` (rl_control.py), `lora` (lora_control.py), `profiler` (profiling.py).
Embedding requests (embedding.py), scoring (scoring.py) and sessions (sessions.py) use it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import zmq
import zmq.asyncio

from radixlm.config import PortArgs
from radixlm.engine.control_calls import ControlCalls
from radixlm.engine.lora_control import LoRAControl
from radixlm.engine.mm_processor import multimodal_prompt
from radixlm.engine.observability import Observability
from radixlm.engine.profiling import ProfilerControl
from radixlm.engine.req_state import ReqState
from radixlm.engine.request_tokenizer import RequestTokenizer
from radixlm.engine.rl_control import RLControl
from radixlm.engine.tokenizer_manager_config import TokenizerManagerConfig
from radixlm.engine.tokenizer_pool import TokenizerPool
from radixlm.ipc import (
    AbortReq,
    BatchStrOut,
    EmbeddingReqInput,
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
from radixlm.sampling_params import SamplingParams

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


class TokenizerManager:
    def __init__(
        self,
        config: TokenizerManagerConfig,
        port_args: PortArgs,
        tokenizer,
        scheduler_info: dict,
        observability: Observability | None = None,
    ):
        self.config = config
        self.port_args = port_args
        self.tokenizer = tokenizer
        self.context_len = scheduler_info["context_len"]
        self.vocab_size = scheduler_info["vocab_size"]
        self.scheduler_info = scheduler_info
        self.rid_to_state: dict[str, ReqState] = {}
        # Control calls to the scheduler, and the components made of them.
        self.control = ControlCalls(self._send, self._check_alive)
        self.rl = RLControl(self.control)  # weights from disk, pause, memory (docs/rl.md)
        self.lora = LoRAControl(self.control, scheduler_info, self.rid_to_state)  # docs/lora.md
        self.observability = observability or Observability()
        self.profiler = ProfilerControl(self.control, self.observability.device)
        self.dead_message: str | None = None
        self.loop_failure: str | None = (
            None  # the receive loop failed: the engine must go (the watchdog reads it)
        )
        # Requests validated and tokenized (multimodal_prompt: the processor is built here, at
        # the first image).
        self.requests = RequestTokenizer(
            config, tokenizer, scheduler_info, self.lora, functools.partial(multimodal_prompt, self)
        )
        self.max_token_chars = self.requests.max_token_chars
        # Tokenization and chat templates run there, off the event loop.
        self.tokenizer_pool = TokenizerPool(config.tokenizer_timeout)

    @property
    def is_embedding(self) -> bool:
        """An embedding model (--is-embedding): it serves EmbeddingReqInputs only."""
        return bool(self.scheduler_info.get("is_embedding"))

    def encode_prompt(self, text: str) -> list[int]:
        """The prompt's ids; a ValueError when it cannot fit the context (RequestTokenizer's)."""
        return self.requests.encode_prompt(text)

    async def start(self) -> None:
        """Create the sockets and the receive loop on the running event loop."""
        ctx = zmq.asyncio.Context(2)
        self.recv_from_detokenizer = ctx.socket(zmq.PULL)
        self.recv_from_detokenizer.bind(self.port_args.tokenizer_ipc_name)
        self.send_to_scheduler = ctx.socket(zmq.PUSH)
        self.send_to_scheduler.connect(self.port_args.scheduler_input_ipc_name)
        self._loop_task = asyncio.get_running_loop().create_task(self.handle_loop())

    # --------------------------------------------------------------- generate
    def generate_request(
        self, obj: GenerateReqInput, admit: Callable[[int], None] | None = None
    ) -> AsyncIterator[Any]:
        """Yields response dicts: for a single request with n == 1 one dict per update (the
        final one when not streaming); otherwise a list (or, streaming, dicts with "index").
        admit(number of requests) may refuse them (by raising) right before they are registered,
        with no await in between: a queue limit counted there holds however many calls race."""
        return self.observability.watch(obj, self._generate(obj, admit), self.tokenizer)

    async def _generate(
        self, obj: GenerateReqInput, admit: Callable[[int], None] | None
    ) -> AsyncIterator[Any]:
        if isinstance(obj, EmbeddingReqInput) != self.is_embedding:
            raise ValueError(
                "this server serves an embedding model (--is-embedding): use /v1/embeddings or"
                " /encode"
                if self.is_embedding
                else (
                    "this server serves a generation model: embeddings need an embedding model"
                    " served with --is-embedding"
                )
            )
        self._check_alive()
        reqs = await self.tokenizer_pool.run(self.requests.expand, obj)
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
        self.observability.registered(st, r.input_ids, self.tokenizer)
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
        elif not self.control.deliver(msg):  # else a control call's reply
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
        if c.embedding is not None:  # an embedding request's, with its last chunk
            st.meta["embedding"] = c.embedding
        st.finished_reason = c.finished_reason
        st.dirty = True
        st.event.set()
        if st.finished_reason is not None:
            self.observability.finished(st)

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

    def _send(self, msg) -> None:
        self.send_to_scheduler.send_pyobj(msg)

    def pending_age(self) -> float:
        """Seconds the oldest request or control call still waiting on the engine has waited (0:
        none). Read by the watchdog thread: it copies the containers (atomic under the GIL)."""
        sent = [st.created for st in list(self.rid_to_state.values()) if st.finished_reason is None]
        sent += self.control.sent_times()
        return time.perf_counter() - min(sent) if sent else 0.0

    async def flush_cache(self, level: str = "l1") -> FlushCacheReqOutput:
        return await self.control.call(FlushCacheReq(level), FlushCacheReqOutput)

    async def get_internal_state(self) -> dict:
        return (await self.control.call(GetInternalStateReq(), GetInternalStateReqOutput)).state

    def mark_dead(self, message: str) -> None:
        """A child process died: fail everything in flight instead of hanging."""
        if self.dead_message is None:
            self.observability.engine_died(message)  # the crash dump
        self.dead_message = message
        for st in self.rid_to_state.values():
            st.event.set()
        self.control.fail_all(lambda: EngineDeadError(message))

    def _check_alive(self) -> None:
        if self.dead_message is not None:
            raise EngineDeadError(self.dead_message)
