"""EngineBackend: the in-process radixlm.Engine (no HTTP). Give it an Engine, or the Engine's
arguments and it starts (and on shutdown() stops) its own."""

from __future__ import annotations

from collections.abc import Iterator

from radixlm.lang.native_backend import NativeBackend

_ARGS = (
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "lora_path",
    "image_data",
)


class EngineBackend(NativeBackend):
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

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        # The tokenizer manager's own encoding, so cache keys match what the engine stores.
        return [self.engine.tokenizer.encode(t) for t in texts]

    def _args(self, body: dict) -> dict:
        return dict(
            prompt=body.get("text"),
            input_ids=body.get("input_ids"),
            sampling_params=body.get("sampling_params"),
            **{k: body[k] for k in _ARGS if k in body},
        )

    def _call(self, body: dict):
        return self.engine.generate(**self._args(body))

    def _stream(self, body: dict) -> Iterator[dict]:
        return self.engine.generate(stream=True, **self._args(body))

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def shutdown(self) -> None:
        if self._owned:
            self.engine.shutdown()
