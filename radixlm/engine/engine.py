"""Engine: the offline, in-process API. Launches the scheduler and detokenizer processes and
drives them through a TokenizerManager on a private event-loop thread."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from radixlm.config import ServerArgs
from radixlm.engine.launcher import (
    check_server_args,
    launch_engine_processes,
    stop_processes,
    watch_processes,
)
from radixlm.engine.rerank import RerankResult, rerank
from radixlm.engine.rl_control import (
    get_weights_request,
    memory_request,
    pause_request,
    update_weights_request,
)
from radixlm.engine.scoring import ScoreResult, score_request
from radixlm.ipc import (
    GenerateReqInput,
    ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput,
)

logger = logging.getLogger(__name__)

Prompt = str | list[str] | None
_ENGINE_OWNER = "engine"  # the in-process caller: one owner for the per-key session limit


class Engine:
    """`Engine(model_path=None, **server_args)`; `generate`, `async_generate`, streaming,
    `flush_cache`, `shutdown`; SGLang's RL methods (`update_weights_from_disk`,
    `get_weights_by_name`, `pause_generation`, `release_memory_occupation`, ...); a context
    manager."""

    def __init__(self, model_path: str | None = None, **kwargs: Any):
        from radixlm.engine.chat_templates import apply_chat_template_option
        from radixlm.engine.process_context import start_fork_server
        from radixlm.model.loader import default_model_path, load_tokenizer
        from radixlm.utils import configure_logging

        known = {f.name for f in dataclasses.fields(ServerArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"Engine got unknown option(s): {', '.join(unknown)}")
        from radixlm.model.hub import resolve_model_paths

        server_args = ServerArgs(model_path=model_path, **kwargs)
        configure_logging(server_args.log_level)
        check_server_args(server_args)  # a bad option fails before a Hub model id is downloaded
        self.server_args = resolve_model_paths(server_args)
        start_fork_server()  # its imports overlap the tokenizer's load below
        self._procs: list = []
        self._closed = False
        tok_path = (
            self.server_args.tokenizer_path or self.server_args.model_path or default_model_path()
        )
        self.tokenizer = load_tokenizer(tok_path)
        apply_chat_template_option(
            self.tokenizer, self.server_args.chat_template
        )  # --chat-template, as served
        self._procs, self.port_args, self.scheduler_info = launch_engine_processes(self.server_args)
        from radixlm.engine.observability import Observability
        from radixlm.engine.tokenizer_manager import TokenizerManager
        from radixlm.engine.tokenizer_manager_config import TokenizerManagerConfig

        self.tokenizer_manager = TokenizerManager(
            TokenizerManagerConfig.from_server_args(self.server_args),
            self.port_args,
            self.tokenizer,
            self.scheduler_info,
            Observability.from_server_args(self.server_args),
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="radixlm-engine-loop", daemon=True
        )
        self._thread.start()
        self._run(self.tokenizer_manager.start())
        tm = self.tokenizer_manager
        watch_processes(
            self._procs,
            lambda msg: self._loop.call_soon_threadsafe(tm.mark_dead, msg),
            lambda: self._closed,
            self.server_args.watchdog_interval,
            tm,
            self.server_args.watchdog_timeout,
        )
        # Stops the child processes when the Engine is collected or the interpreter exits
        # (an atexit hook on self.shutdown would pin every Engine in memory until exit).
        weakref.finalize(self, stop_processes, self._procs, self.port_args)

    # ----------------------------------------------------------------- plumbing
    def _run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @staticmethod
    def _make_request(prompt, sampling_params, input_ids, **kw) -> GenerateReqInput:
        return GenerateReqInput(
            text=prompt, input_ids=input_ids, sampling_params=sampling_params, **kw
        )

    async def _collect(self, obj: GenerateReqInput, session_params: dict | None = None):
        out = None
        async for out in await self._responses(obj, session_params):  # noqa: B007 (the last item is the result)
            pass
        return out

    async def _responses(self, obj: GenerateReqInput, session_params: dict | None):
        if session_params is None:
            return self.tokenizer_manager.generate_request(obj)
        sessions = self._sessions()
        return sessions.run(await sessions.prepare(_ENGINE_OWNER, obj, session_params))

    def _sessions(self):
        from radixlm.engine.sessions import session_manager

        return session_manager(self.tokenizer_manager, self.server_args)

    # ---------------------------------------------------------------- public
    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] = -1,
        top_logprobs_num: int | list[int] = 0,
        return_text_in_logprobs: bool = False,
        stream: bool = False,
        rid: str | list[str] | None = None,
        priority: int | list[int] | None = None,
        cache_salt: str | list[str] | None = None,
        session_params: dict | None = None,
        lora_path: str | list[str | None] | None = None,
        image_data: str | list | None = None,
    ):
        """A dict {text, output_ids, meta_info} for one prompt; a list for a batch (or n > 1);
        with stream=True an iterator of cumulative dicts. session_params: a turn of an open session
        (open_session; SGLang's fields id, rid, offset, replace, drop_previous_output)."""
        obj = self._make_request(
            prompt,
            sampling_params,
            input_ids,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs,
            stream=stream,
            rid=rid,
            priority=priority,
            cache_salt=cache_salt,
            lora_path=lora_path,
            image_data=image_data,
        )
        if stream:
            return self._stream(obj, session_params)
        return self._run(self._collect(obj, session_params))

    def _stream(self, obj: GenerateReqInput, session_params: dict | None = None) -> Iterator[dict]:
        q: queue.Queue = queue.Queue()
        done = object()

        async def pump():
            try:
                async for out in await self._responses(obj, session_params):
                    q.put(out)
            except BaseException as e:
                q.put(e)
            finally:
                q.put(done)

        fut = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while True:
                item = q.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not fut.done():
                fut.cancel()  # the generator's finally aborts the request

    async def async_generate(
        self,
        prompt: Prompt = None,
        sampling_params=None,
        input_ids=None,
        stream: bool = False,
        **kw,
    ):
        """Awaitable from any event loop; with stream=True an async iterator (kw: generate's, with
        session_params)."""
        session_params = kw.pop("session_params", None)
        obj = self._make_request(prompt, sampling_params, input_ids, stream=stream, **kw)
        if not stream:
            return await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(self._collect(obj, session_params), self._loop)
            )
        return self._async_stream(obj, session_params)

    async def _async_stream(self, obj, session_params: dict | None = None):
        it = self._stream(obj, session_params)
        sentinel = object()
        try:
            while True:
                item = await asyncio.to_thread(next, it, sentinel)
                if item is sentinel:
                    return
                yield item
        finally:
            it.close()  # a consumer that leaves early aborts the request

    def score(
        self,
        query=None,
        items=None,
        label_token_ids=None,
        apply_softmax: bool = False,
        item_first: bool = False,
    ) -> ScoreResult:
        """SGLang's Engine.score: per item, the probabilities of label_token_ids as the next token
        after query + item (engine/scoring.py); a ScoreError (ValueError) names a bad argument."""
        return self._run(
            score_request(
                self.tokenizer_manager, query, items, label_token_ids, apply_softmax, item_first
            )
        )

    def rerank(self, query: str, documents: list[str], instruct: str | None = None) -> RerankResult:
        """Each document's relevance to the query on a reranker model (engine/rerank.py):
        `.scores()` in the documents' order; a RerankError (ValueError) names a bad argument."""
        return self._run(rerank(self.tokenizer_manager, query, documents, instruct))

    def encode(self, prompt: Any) -> dict | list[dict]:
        """SGLang's Engine.encode (an engine made with is_embedding=True): {"embedding",
        "meta_info"} for a str or a list of token ids, a list of them for a list of either
        (engine/embedding.py).
        """
        from radixlm.engine.embedding import embed, embedding_items

        single = embedding_items(prompt)[1]
        res = self._run(embed(self.tokenizer_manager, prompt))
        outs = [{"embedding": e, "meta_info": m} for e, m in zip(res.embeddings, res.meta_infos)]
        return outs[0] if single else outs

    def open_session(
        self,
        capacity_of_str_len: int | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Open a session (its KV stays pinned until close_session or `timeout` idle seconds, at
        most
        --session-timeout); returns its id. A refusal is a ValueError (engine/sessions.py:
        SessionError).
        """
        body = {
            "capacity_of_str_len": capacity_of_str_len,
            "session_id": session_id,
            "timeout": timeout,
        }

        async def open_():  # on the engine's loop: the timeout sweeper runs there
            return self._sessions().open(_ENGINE_OWNER, body)

        return self._run(open_())

    def close_session(self, session_id: str) -> None:
        async def close():
            self._sessions().close(_ENGINE_OWNER, session_id)

        self._run(close())

    def load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False) -> dict:
        """Load a peft adapter under `lora_name` (SGLang's call); ValueError naming what is
        wrong."""
        return dataclasses.asdict(
            self._run(self.tokenizer_manager.lora.load_lora_adapter(lora_name, lora_path, pinned))
        )

    def unload_lora_adapter(self, lora_name: str) -> None:
        """Unload an adapter, once the requests under it have finished."""
        self._run(self.tokenizer_manager.lora.unload_lora_adapter(lora_name))

    def flush_cache(self, level: str = "l1") -> bool:
        """Empty the KV pool; with --enable-hierarchical-cache, level "l2" / "l3" also empties the
        host tier / the storage tier."""
        return self._run(self.tokenizer_manager.flush_cache(level)).success

    def get_internal_state(self) -> dict:
        return self._run(self.tokenizer_manager.get_internal_state())

    def start_profile(self, **fields) -> str:
        """SGLang's Engine.start_profile: a torch profiler trace of the scheduler (fields:
        /start_profile's,
        e.g. output_dir, num_steps, activities); the scheduler's message."""
        return self._profile_result(self._run(self.tokenizer_manager.profiler.start(fields)))

    def stop_profile(self) -> str:
        """Stop profiling and write the trace; the message names its file."""
        return self._profile_result(self._run(self.tokenizer_manager.profiler.stop()))

    @staticmethod
    def _profile_result(out) -> str:
        if not out.success:
            raise RuntimeError(out.message)
        return out.message

    def abort_request(self, rid: str = "") -> None:
        self._loop.call_soon_threadsafe(self.tokenizer_manager.abort_request, rid)

    # -------------------------------------------- RL: SGLang's Engine methods (docs/rl.md)
    def update_weights_from_disk(
        self, model_path: str, load_format: str | None = None, **kw: Any
    ) -> tuple[bool, str, int]:
        """Serve the checkpoint at model_path (the served architecture and shape) from now on;
        requests in flight finish on the old weights; the cache is flushed (flush_cache=False keeps
        it). kw: abort_all_requests, flush_cache, weight_version, keep_pause. SGLang's (success,
        message, num_paused_requests); a refused checkpoint raises ValueError and the old weights
        serve on.
        """
        obj = update_weights_request({"model_path": model_path, "load_format": load_format, **kw})
        out = self._run(self.tokenizer_manager.rl.update_weights_from_disk(obj))
        return out.success, out.message, out.num_paused_requests

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        """The checkpoint tensor `name` as served (float32 lists), its first truncate_size rows."""
        obj = get_weights_request({"name": name, "truncate_size": truncate_size})
        return self._run(self.tokenizer_manager.rl.get_weights_by_name(obj))

    def pause_generation(self, mode: str = "abort") -> None:
        """abort: abort what is in flight; retract: requeue it (recomputed later); in_place: it
        waits. New requests wait until continue_generation."""
        self._run(self.tokenizer_manager.rl.pause_generation(pause_request({"mode": mode})))

    def continue_generation(self) -> None:
        self._run(self.tokenizer_manager.rl.continue_generation())

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        """Free the weights' and / or the KV cache's memory ("weights", "kv_cache"; None: both);
        requests wait until resume_memory_occupation brings them back."""
        obj = memory_request(
            {"tags": tags}, ReleaseMemoryOccupationReqInput, "release_memory_occupation"
        )
        self._run(self.tokenizer_manager.rl.release_memory_occupation(obj))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        """The weights come back from the checkpoint they were last loaded from."""
        obj = memory_request(
            {"tags": tags}, ResumeMemoryOccupationReqInput, "resume_memory_occupation"
        )
        self._run(self.tokenizer_manager.rl.resume_memory_occupation(obj))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        stop_processes(self._procs, self.port_args)
        if self._loop.is_running():
            try:
                self._run(self.tokenizer_manager.close(), timeout=5)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
