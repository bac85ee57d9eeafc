"""LazyTokenizer: the model's tokenizer, loaded at its first use (stop strings, grammars,
jump-forward, the hierarchical cache's model key), so a scheduler whose requests need none never
pays for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LazyTokenizer:
    def __init__(self, load: Callable[[], Any]):
        self._load = load
        self._tokenizer: Any = None

    def get(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self._load()
        return self._tokenizer

    def set(self, tokenizer: Any) -> None:
        """Use this tokenizer from now on (None: load the model's again at the next use)."""
        self._tokenizer = tokenizer
