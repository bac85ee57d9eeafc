"""What the interpreter asks of a backend: generate (whole or streamed), select among choices,
prefill a shared prefix, and the chat template that renders roles. Plus the default backend."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from radixlm.lang.chat_template import ChatTemplate

QWEN_IMAGE_PAD = "<|image_pad|>"


@dataclass
class Prompt:
    """The state as a backend sees it: the whole text, and the same as chat messages."""

    text: str
    messages: list[dict] = field(default_factory=list)  # closed messages
    role: str | None = None  # the role still open, if any
    role_text: str = ""  # what the open role holds so far
    images: list[str] = field(default_factory=list)  # image(): base64 images, in the text's order


class BaseBackend:
    """Subclasses implement generate, generate_stream and select; prefill is optional."""

    def __init__(self):
        self._tok_lock = threading.Lock()
        self._tokenizer = None
        self._chat_template: ChatTemplate | None = None

    def _load_tokenizer(self):
        return None

    def _make_chat_template(self) -> ChatTemplate:
        return ChatTemplate(self.tokenizer)

    @property
    def tokenizer(self):
        with self._tok_lock:
            if self._tokenizer is None:
                self._tokenizer = self._load_tokenizer()
            return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            self._chat_template = self._make_chat_template()
        return self._chat_template

    @property
    def image_token(self) -> str:
        """What image() writes into the text where the image goes: the tokenizer's image token
        (transformers' multimodal tokenizers name it), else LLaVA's "<image>"; Qwen2-VL's
        <|image_pad|> between its vision markers, as its chat template (and SGLang's) writes an
        image.
        """
        tok = self.tokenizer
        token = getattr(tok, "image_token", None)
        if token is None and tok.convert_tokens_to_ids(QWEN_IMAGE_PAD) not in (
            None,
            tok.unk_token_id,
        ):
            token = QWEN_IMAGE_PAD
        return (
            f"<|vision_start|>{token}<|vision_end|>"
            if token == QWEN_IMAGE_PAD
            else token or "<image>"
        )

    def generate(self, prompt: Prompt, sampling_params: dict, logprob: dict | None = None) -> dict:
        """-> {"text": completion, "meta_info": {...}}"""
        raise NotImplementedError

    def generate_stream(
        self, prompt: Prompt, sampling_params: dict, logprob: dict | None = None
    ) -> Iterator[dict]:
        """Cumulative {"text", "meta_info"} as the completion grows."""
        raise NotImplementedError

    def select(self, prompt: Prompt, choices: list[str], method) -> tuple[int, dict]:
        """-> (index of the chosen choice, meta info with the scores)"""
        raise NotImplementedError

    def prefill(self, text: str) -> dict | None:
        """Put `text` in the server's prefix cache without generating; returns its meta_info
        (None where the backend cannot)."""
        return None

    def flush_cache(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


_default: BaseBackend | None = None


def set_default_backend(backend: BaseBackend | None) -> None:
    global _default
    _default = backend


def get_default_backend() -> BaseBackend | None:
    return _default
