"""EngineBackend: the in-process radixlm.Engine (no HTTP). Give it an Engine, or the Engine's
arguments and it starts (and on shutdown() stops) its own."""

from __future__ import annotations

from typing import Iterator

from radixlm.lang.base_backend import BaseBackend

_LOGPROB_ARGS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


class EngineBackend(BaseBackend):
    def __init__(self, engine=None, **engine_kwargs):
        super().__init__()
        if engine is None or isinstance(engine, str):
            from radixlm.engine.engine import Engine

            engine, self._owned = Engine(engine, **engine_kwargs), True
        else:
            self._owned = False
        self.engine = engine

    def _load_tokenizer(self):
        return self.engine.tokenizer

    def _args(self, body: dict) -> dict:
        return dict(prompt=body["text"], sampling_params=body.get("sampling_params"),
                    **{k: body[k] for k in _LOGPROB_ARGS if k in body})

    def _call(self, body: dict):
        return self.engine.generate(**self._args(body))

    def _stream(self, body: dict) -> Iterator[dict]:
        return self.engine.generate(stream=True, **self._args(body))

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def shutdown(self) -> None:
        if self._owned:
            self.engine.shutdown()
