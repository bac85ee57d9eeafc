"""Role prefixes and suffixes, read off the served model's tokenizer chat template."""

from __future__ import annotations

import threading

_MARK = "\x00RADIXLM_CONTENT\x00"
_FALLBACK = {"system": ("", "\n\n"), "user": ("User: ", "\n"), "assistant": ("Assistant: ", "\n")}


class ChatTemplate:
    """`prefix(role, first)` / `suffix(role)`; `first` is True for the first message of a chat
    (templates such as SmolLM2's put a default system prompt there)."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer
        self._cache: dict = {}
        self._lock = threading.Lock()

    def _render(self, messages: list) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)

    def _split(self, role: str, first: bool) -> tuple[str, str]:
        tok = self.tokenizer
        if tok is None or not getattr(tok, "chat_template", None):
            return _FALLBACK.get(role, (f"{role}: ", "\n"))
        history = [] if first else [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        if not first and role == "user":
            history = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                       {"role": "assistant", "content": "A"}]
        before = self._render(history) if history else ""
        full = self._render([*history, {"role": role, "content": _MARK}])
        if not full.startswith(before) or _MARK not in full:
            return _FALLBACK.get(role, (f"{role}: ", "\n"))
        head, tail = full[len(before):].split(_MARK, 1)
        return head, tail

    def parts(self, role: str, first: bool) -> tuple[str, str]:
        key = (role, first)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = self._split(role, first)
            return self._cache[key]

    def prefix(self, role: str, first: bool) -> str:
        return self.parts(role, first)[0]

    def suffix(self, role: str) -> str:
        return self.parts(role, False)[1]
