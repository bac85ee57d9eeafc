"""A request's sampling_params as the scheduler gets them: the server's defaults under the client's
own values (an explicit value always wins; null means unset), validated, with the token forms of
bad_words and dry_sequence_breakers. The tokenizer work runs here, on the tokenizer threads, never
on the scheduler's."""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Mapping
from typing import Any

from radixlm.constrained.thinking import ThinkMarkers
from radixlm.reasoning import get_reasoning_format
from radixlm.sampling_params import (
    DRY_SEQUENCE_BREAKERS,
    SamplerTokens,
    SamplingParams,
    SamplingParamsError,
)

MAX_BREAKER_TAIL_TOKENS = 20  # llama.cpp's bound on a breaker's tokens after its head


class RequestSampling:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        defaults: Mapping[str, Any] | None = None,
        reasoning_parser: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.defaults = dict(defaults or {})
        self.think_markers = None if reasoning_parser is None else self._markers(reasoning_parser)
        self._pieces: list[str] | None = None
        self._lock = threading.Lock()
        self.breaker_forms = functools.lru_cache(maxsize=64)(self._breaker_forms)

    def params(self, d: Any) -> SamplingParams:
        """The request's SamplingParams; a SamplingParamsError naming the field when one is bad.
        A SamplingParams object (the Engine) is taken as it is: every field of it is set."""
        if self.defaults and (d is None or isinstance(d, dict)):
            d = {**self.defaults, **{k: v for k, v in (d or {}).items() if v is not None}}
        sp = SamplingParams.from_dict(copy.deepcopy(d))
        sp.verify(self.vocab_size)
        if sp.uses_history_samplers:
            sp.resolved_tokens = self.tokens(sp)
        if sp.thinks:
            if self.think_markers is None:
                name = (
                    "max_thinking_tokens"
                    if sp.max_thinking_tokens is not None
                    else "require_reasoning"
                )
                raise SamplingParamsError(
                    f"sampling_params.{name} needs a server started with --reasoning-parser "
                    "(the think block's markers)"
                )
            sp.think_markers = self.think_markers
        return sp

    @classmethod
    def from_info(cls, tokenizer, info: Mapping[str, Any]) -> RequestSampling:
        """From the engine's facts (launcher.py): vocabulary, sampling defaults, reasoning
        parser."""
        return cls(
            tokenizer,
            info["vocab_size"],
            info.get("sampling_defaults"),
            info.get("reasoning_parser"),
        )

    def _markers(self, reasoning_parser: str) -> ThinkMarkers:
        """The reasoning format's markers as the served tokenizer spells them (one or several
        tokens)."""
        fmt = get_reasoning_format(reasoning_parser)
        encode = lambda text: tuple(self.tokenizer.encode(text, add_special_tokens=False))
        return ThinkMarkers(encode(fmt.start), encode(fmt.end))

    def tokens(self, sp: SamplingParams) -> SamplerTokens:
        words = tuple(ids for w in sp.bad_words_list for ids in self.bad_word_ids(w))
        for ids in words:
            if max(ids) >= self.vocab_size:
                raise SamplingParamsError(
                    f"sampling_params.bad_words: a word tokenizes to id {max(ids)}, outside "
                    f"the model's vocabulary of {self.vocab_size}"
                )
        single, multi = frozenset(), None
        if sp.dry_active:
            breakers = (
                DRY_SEQUENCE_BREAKERS
                if sp.dry_sequence_breakers is None
                else sp.dry_sequence_breakers
            )
            single, multi = self.breaker_forms(tuple(breakers))
        return SamplerTokens(bad_words=words, dry_single=single, dry_multi=multi)

    def bad_word_ids(self, word: str) -> list[tuple[int, ...]]:
        """vLLM's forms of a bad word: its tokens, and those of " word" when that is a different
        token sequence of the same length (a word in the middle of a text)."""
        out: list[tuple[int, ...]] = []
        for prefix in ("", " "):
            ids = tuple(self.tokenizer.encode(prefix + word.lstrip(), add_special_tokens=False))
            if ids and (not prefix or (ids[0] != out[-1][0] and len(ids) == len(out[-1]))):
                out.append(ids)
        return out

    def _breaker_forms(self, breakers: tuple[str, ...]) -> tuple[frozenset, dict]:
        """llama.cpp's restart sequences: a token whose text holds a breaker is one on its own; a
        token whose text ends with the start of a breaker is a head, the tokens of the breaker's
        rest its tail.
        """
        pieces = self.pieces()
        single: set[int] = set()
        multi: dict[int, set] = {}
        for b in breakers:
            tails = {
                k: tuple(
                    self.tokenizer.encode(b[k:], add_special_tokens=False)[:MAX_BREAKER_TAIL_TOKENS]
                )
                for k in range(1, len(b))
            }
            for tid, word in enumerate(pieces):
                if b in word:
                    single.add(tid)
                    continue
                for k, tail in tails.items():
                    if word.endswith(b[:k]) and tail:
                        multi.setdefault(tid, set()).add(tail)
                    elif word.endswith(
                        b[:k]
                    ):  # the rest tokenizes to nothing: a breaker on its own
                        single.add(tid)
        return frozenset(single), {h: tuple(sorted(t)) for h, t in multi.items()}

    def pieces(self) -> list[str]:
        """Each token id's own text (decoded alone), computed once."""
        with self._lock:
            if self._pieces is None:
                n = min(len(self.tokenizer), self.vocab_size)
                decode = (
                    self.tokenizer.decode
                )  # one id at a time: faster than batch_decode's padding
                self._pieces = [decode([i], skip_special_tokens=False) for i in range(n)]
            return self._pieces
