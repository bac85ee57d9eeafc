"""@function: a Python function over a ProgramState, with run / run_batch."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from radixlm.lang.base_backend import get_default_backend
from radixlm.lang.state import ProgramState

logger = logging.getLogger(__name__)

# run()'s sampling defaults (SGLang's names), applied to every gen that leaves them unset.
RUN_SAMPLING_ARGS = (
    "max_new_tokens",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
    "seed",
)


class SglFunction:
    def __init__(self, func: Callable, num_api_spec_tokens: int | None = None):
        self.func = func
        functools.update_wrapper(self, func)
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError("@function: the program's first parameter must be the state `s`")
        self.arg_names = params[1:]

    def _split(self, kwargs: dict) -> tuple[dict, dict]:
        sampling = {
            k: kwargs.pop(k)
            for k in list(kwargs)
            if k in RUN_SAMPLING_ARGS and k not in self.arg_names
        }
        if "max_tokens" in sampling:
            sampling.setdefault("max_new_tokens", sampling.pop("max_tokens"))
        if "max_new_tokens" in sampling:
            sampling["max_tokens"] = sampling.pop("max_new_tokens")
        return sampling, kwargs

    def _start(
        self, args, kwargs, backend, stream: bool, precache: bool
    ) -> tuple[ProgramState, Callable]:
        sampling, kwargs = self._split(kwargs)
        s = ProgramState(
            backend or get_default_backend(), sampling, stream=stream, precache=precache
        )

        def body():
            try:
                s.ret_value = self.func(s, *args, **kwargs)
                s.sync()
            except BaseException as e:
                if s._error is None:
                    s._error = e
            finally:
                s._finish_stream()

        return s, body

    def run(
        self, *args, backend=None, stream: bool = False, precache: bool = True, **kwargs
    ) -> ProgramState:
        """Run the program; returns its state (already complete unless stream=True, in which case
        read it with s.text_iter() / s[...] as it runs). precache=False: fork() does not send the
        shared prefix ahead of the branches."""
        s, body = self._start(args, kwargs, backend, stream, precache)
        if stream:
            threading.Thread(target=body, name="radixlm-lang-run", daemon=True).start()
            return s
        body()
        if s._error is not None:
            raise s._error
        return s

    def run_batch(
        self,
        batch_kwargs: list[dict],
        *,
        backend=None,
        num_threads="auto",
        progress_bar: bool = False,
        precache: bool = True,
        **sampling,
    ) -> list[ProgramState]:
        """Run once per kwargs dict, concurrently; states come back in input order. The text all
        inputs share before their first gen is traced and sent once first, so every program hits
        the cache for it. A program that raises does not stop the others: its state holds the
        exception (`state.error()`; reading the state re-raises it)."""
        backend = backend or get_default_backend()
        if backend is None:
            raise ValueError("no backend: pass backend= or call radixlm.lang.set_default_backend()")
        if num_threads == "auto":
            num_threads = max(1, min(len(batch_kwargs), 4 * (os.cpu_count() or 1), 64))
        if precache and len(batch_kwargs) > 1:
            from radixlm.lang.tracer import common_prefix

            prefix = common_prefix(self, batch_kwargs, backend)
            if prefix.strip():
                backend.prefill(prefix)

        def one(i: int, kw: dict) -> ProgramState:
            s, body = self._start((), {**sampling, **kw}, backend, False, precache)
            body()
            if s._error is not None:
                logger.warning(
                    "run_batch: program %d of %d failed: %r", i, len(batch_kwargs), s._error
                )
            return s

        with ThreadPoolExecutor(
            max(1, int(num_threads)), thread_name_prefix="radixlm-batch"
        ) as pool:
            futs = [pool.submit(one, i, kw) for i, kw in enumerate(batch_kwargs)]
            if progress_bar:
                from tqdm import tqdm

                for _ in tqdm(
                    as_completed(futs), total=len(futs), desc=f"run_batch {self.__name__}"
                ):
                    pass
            return [f.result() for f in futs]

    def __call__(self, *args, **kwargs) -> ProgramState:
        return self.run(*args, **kwargs)


def function(func: Callable | None = None, *, num_api_spec_tokens: int | None = None):
    """`@function` or `@function(...)`: make a program from `def prog(s, ...)`."""
    if func is None:
        return lambda f: SglFunction(f, num_api_spec_tokens)
    return SglFunction(func)
