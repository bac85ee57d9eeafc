"""TokenizerPool: tokenization and chat templating on worker threads, under a time bound.

The event loop that runs them serves every request, stream and /health of the server: a long
prompt or a slow template rendered there would stall them all. On a worker thread it stalls
only its own request (HF's fast tokenizers release the GIL while they encode; a template holds it
in 5 ms turns). A thread cannot be stopped, so the bound is for the client: past it the request
fails with TokenizerTimeout, and the thread finishes in the background.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class TokenizerTimeout(Exception):
    """Tokenizing or templating a request took longer than the bound (--tokenizer-timeout)."""


class TokenizerPool:
    def __init__(self, timeout: float, workers: int = min(4, os.cpu_count() or 1)):
        self.timeout = timeout
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="radixlm-tokenize")

    async def run(self, fn: Callable[..., T], *args, what: str = "tokenizing the request") -> T:
        """fn(*args) on a worker thread; its exceptions propagate, TokenizerTimeout past the
        bound."""
        fut = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        done, _ = await asyncio.wait({fut}, timeout=self.timeout)
        if not done:
            fut.cancel()  # still queued: never runs; running: its result is dropped
            raise TokenizerTimeout(
                f"{what} took longer than {self.timeout:g} s (--tokenizer-timeout)"
            )
        return fut.result()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
