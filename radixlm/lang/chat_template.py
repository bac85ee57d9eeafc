"""Role prefixes and suffixes: read off the served model's tokenizer chat template when there is
one (so roles render exactly as the model expects), else from a small by-name registry."""

from __future__ import annotations

import threading
from dataclasses import dataclass

_MARK = "\x00RADIXLM_CONTENT\x00"


@dataclass(frozen=True)
class NamedTemplate:
    roles: dict  # role -> (prefix, suffix)
    first: str = ""  # before the first message of a chat (e.g. a BOS token)
    default_system: str = (
        ""  # a whole system message some templates put before a first non-system message
    )


def _chatml(default_system: str = "") -> NamedTemplate:
    roles = {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")}
    sys = f"<|im_start|>system\n{default_system}<|im_end|>\n" if default_system else ""
    return NamedTemplate(roles, default_system=sys)


CHAT_TEMPLATES: dict[str, NamedTemplate] = {
    "default": NamedTemplate(
        {"system": ("", "\n\n"), "user": ("User: ", "\n"), "assistant": ("Assistant: ", "\n")}
    ),
    "chatml": _chatml(),
    "smollm2": _chatml("You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    "qwen": _chatml("You are a helpful assistant."),
    "llama-3-instruct": NamedTemplate(
        {
            r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>")
            for r in ("system", "user", "assistant")
        },
        first="<|begin_of_text|>",
    ),
}

# Model-name fragments (lower case) -> template name, first match wins.
_BY_MODEL = [
    ("smollm", "smollm2"),
    ("qwen", "qwen"),
    ("llama-3", "llama-3-instruct"),
    ("llama3", "llama-3-instruct"),
    ("chatml", "chatml"),
]


def template_name_for_model(model: str) -> str:
    low = model.lower()
    return next((name for frag, name in _BY_MODEL if frag in low), "default")


class ChatTemplate:
    """`prefix(role, first)` / `suffix(role)`; `first` is True for the first message of a chat
    (templates such as SmolLM2's put a default system prompt there)."""

    def __init__(self, tokenizer=None, name: str | None = None):
        if name is not None and name not in CHAT_TEMPLATES:
            raise ValueError(f"unknown chat template {name!r}; known: {sorted(CHAT_TEMPLATES)}")
        self.tokenizer = tokenizer
        self.name = name
        self._cache: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model: str) -> ChatTemplate:
        return cls(None, template_name_for_model(model))

    def _named(self, role: str, first: bool) -> tuple[str, str]:
        t = CHAT_TEMPLATES[self.name or "default"]
        head, tail = t.roles.get(role, (f"{role}: ", "\n"))
        if first:
            head = t.first + (t.default_system if role != "system" else "") + head
        return head, tail

    def _render(self, messages: list) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=False
        )

    def _split(self, role: str, first: bool) -> tuple[str, str]:
        tok = self.tokenizer
        if self.name is not None or tok is None or not getattr(tok, "chat_template", None):
            return self._named(role, first)
        history = (
            [] if first else [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        )
        if not first and role == "user":
            history = [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"},
            ]
        before = self._render(history) if history else ""
        full = self._render([*history, {"role": role, "content": _MARK}])
        if not full.startswith(before) or _MARK not in full:
            return self._named(role, first)
        head, tail = full[len(before) :].split(_MARK, 1)
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
