"""What the interpreter needs from a backend, on top of one primitive: a native /generate call."""

from __future__ import annotations

import threading
from typing import Iterator, Optional

from radixlm.lang.chat_template import ChatTemplate


def _lps(meta: dict) -> list[float]:
    return [e[0] for e in meta.get("input_token_logprobs") or [] if e and e[0] is not None]


class BaseBackend:
    """Subclasses implement `_call(body)` (a /generate body -> its JSON answer) and `_stream(body)`
    (cumulative answers), and `_load_tokenizer()`."""

    def __init__(self):
        self._tok_lock = threading.Lock()
        self._tokenizer = None
        self._chat_template: Optional[ChatTemplate] = None

    # -- to implement
    def _call(self, body: dict):
        raise NotImplementedError

    def _stream(self, body: dict) -> Iterator[dict]:
        raise NotImplementedError

    def _load_tokenizer(self):
        return None

    # -- shared
    @property
    def tokenizer(self):
        with self._tok_lock:
            if self._tokenizer is None:
                self._tokenizer = self._load_tokenizer()
            return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            self._chat_template = ChatTemplate(self.tokenizer)
        return self._chat_template

    def generate(self, text: str, sampling_params: dict, logprob: Optional[dict] = None) -> dict:
        return self._call({"text": text, "sampling_params": sampling_params, **(logprob or {})})

    def generate_stream(self, text: str, sampling_params: dict, logprob: Optional[dict] = None) -> Iterator[dict]:
        return self._stream({"text": text, "sampling_params": sampling_params, "stream": True, **(logprob or {})})

    def prefill(self, text: str) -> dict:
        """Score `text` with no generation: puts it in the radix cache; returns meta_info."""
        return self._call({"text": text, "sampling_params": {"max_new_tokens": 0}})["meta_info"]

    def score(self, prefix: str, choices: list[str], unconditional: bool = False) -> dict:
        """Logprobs of each choice's tokens after `prefix`, in one batched request (the prefix is
        sent first so the batch hits the cache). With `unconditional`, also each choice alone."""
        n = self.prefill(prefix)["prompt_tokens"]
        outs = self._call({"text": [prefix + c for c in choices], "sampling_params": {"max_new_tokens": 0},
                           "return_logprob": True, "logprob_start_len": n, "return_text_in_logprobs": True})
        res = {"prompt_tokens": n, "metas": [o["meta_info"] for o in outs],
               "logprobs": [_lps(o["meta_info"]) for o in outs]}
        if unconditional:
            un = self._call({"text": list(choices), "sampling_params": {"max_new_tokens": 0},
                             "return_logprob": True, "logprob_start_len": 0})
            res["unconditional"] = [_lps(o["meta_info"]) for o in un]
        return res

    def shutdown(self) -> None:
        pass


_default: Optional[BaseBackend] = None


def set_default_backend(backend: Optional[BaseBackend]) -> None:
    global _default
    _default = backend


def get_default_backend() -> Optional[BaseBackend]:
    return _default
