"""SamplingParams: SGLang's sampling keys, their defaults and their validation (a leaf module; the
checks that need no SamplingParams are sampling_checks.py's)."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

from pydantic.json_schema import SkipJsonSchema

from radixlm.sampling_checks import (
    FLOAT32_MAX,
    MAX_STOP_LEN,
    MAX_STOPS,
    SamplingParamsError,
    brief_repr,
    check_count_and_lengths,
    check_stop_regex,
    finite32,
    max_match_width,
)
from radixlm.stop_match import STOP_REGEX_WINDOW

_GREEDY_EPS = 1e-6
_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
# llama-server's defaults of dry_sequence_breakers (a token whose text holds one ends a repeat).
DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
MAX_DRY_BREAKER_LEN = 40  # characters (llama.cpp cuts longer ones)
MAX_BAD_WORDS = 128
# Fields the server fills in (the token forms of bad_words and dry_sequence_breakers), never a
# client.
_INTERNAL_FIELDS = frozenset({"resolved_tokens", "think_markers"})
# The thinking budget's spellings: the and NVIDIA's, SGLang's (custom_params), vLLM's.
_BUDGET_ALIASES = ("thinking_budget", "thinking_token_budget")
_INT64 = 1 << 63


@dataclass(frozen=True)
class SamplerTokens:
    """The token forms of a request's bad_words and dry_sequence_breakers, made by the tokenizer
    manager (it has the tokenizer; the scheduler's sampler only compares ids)."""

    bad_words: tuple[
        tuple[int, ...], ...
    ] = ()  # vLLM's: each word, without and with a leading space
    dry_single: frozenset = frozenset()  # tokens whose text holds a breaker: each ends a repeat
    # head token -> the tails that complete a breaker after it (llama.cpp's restart sequences)
    dry_multi: dict | None = None


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    # Stop when the output matches one of these (Python regex syntax), trimmed unless no_stop_trim.
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    seed: int | None = None  # radixlm's older name of sampling_seed
    sampling_seed: int | None = None
    # Structured output: at most one of these.
    regex: str | None = None
    json_schema: Any | None = None
    ebnf: str | None = None
    structural_tag: Any | None = None  # xgrammar structural tag (JSON string or object)
    # {token id (as a string, JSON keys are): bias} added to the logits before sampling.
    logit_bias: dict | None = None
    stream_interval: int | None = (
        None  # tokens per streamed chunk (None: the server's --stream-interval)
    )
    custom_params: dict | None = None
    # Extra samplers (docs/sampling.md), with vLLM's and llama-server's names and defaults.
    min_tokens: int | None = None  # OpenAI / vLLM spelling of min_new_tokens
    typical_p: float = 1.0  # locally typical sampling (1: off)
    bad_words: str | list[str] | None = None  # vLLM: words the output may not contain
    allowed_token_ids: list[int] | None = None  # vLLM: only these may be sampled
    dry_multiplier: float = 0.0  # llama.cpp's DRY repetition penalty (0: off)
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # tokens looked back (-1: the whole context, 0: off)
    dry_sequence_breakers: list[str] | None = None  # None: DRY_SEQUENCE_BREAKERS
    xtc_probability: float = 0.0  # llama.cpp's exclude-top-choices (0: off)
    xtc_threshold: float = 0.1
    # Reasoning (constrained/thinking.py): the request starts inside the think block (SGLang's
    # require_reasoning; a budget implies it), which ends after at most this many tokens.
    require_reasoning: bool = False
    max_thinking_tokens: int | None = None
    thinking_budget: int | None = None
    thinking_token_budget: int | None = None
    # Not the client's (left out of /generate's documented schema): set by the tokenizer manager.
    resolved_tokens: SkipJsonSchema[SamplerTokens | None] = dataclasses.field(
        default=None, repr=False, compare=False
    )
    think_markers: SkipJsonSchema[Any | None] = dataclasses.field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def from_dict(cls, d: dict | None) -> SamplingParams:
        if d is None:
            return cls()
        if isinstance(d, SamplingParams):
            return d
        if not isinstance(d, dict):
            raise SamplingParamsError(f"sampling_params must be a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - _INTERNAL_FIELDS
        unknown = sorted(set(d) - known)
        if unknown:
            raise SamplingParamsError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        # As SGLang: null means the default (its frontend sends every key, most of them null).
        sp = cls(**{k: v for k, v in d.items() if v is not None})
        if sp.sampling_seed is not None:
            if sp.seed is not None and sp.seed != sp.sampling_seed:
                raise SamplingParamsError(
                    "sampling_params.seed and sampling_seed differ; give one of them"
                )
            sp.seed = sp.sampling_seed
        sp.sampling_seed = sp.seed
        if (
            sp.min_tokens is not None
        ):  # the alias wins over the default, must agree with an explicit min_new_tokens
            if d.get("min_new_tokens") is not None and d["min_new_tokens"] != sp.min_tokens:
                raise SamplingParamsError(
                    "sampling_params.min_tokens and min_new_tokens differ; give one of them"
                )
            sp.min_new_tokens = sp.min_tokens
        sp._merge_budget_aliases()
        sp.verify()
        return sp

    def verify(self, vocab_size: int | None = None) -> None:
        def bad(name: str, why: str):
            raise SamplingParamsError(
                f"sampling_params.{name} {why}, got {brief_repr(getattr(self, name))}"
            )

        def num(name: str, integer: bool = False):
            v = getattr(self, name)
            ok = isinstance(v, int) if integer else isinstance(v, (int, float))
            if not ok or isinstance(v, bool):
                bad(name, "must be an integer" if integer else "must be a number")
            if not integer and not finite32(v):
                bad(name, f"must be a finite number of at most {FLOAT32_MAX:.3g} in magnitude")
            return v

        if num("max_new_tokens", True) < 0:
            bad("max_new_tokens", "must be >= 0")
        if self.min_tokens is not None and num("min_tokens", True) < 0:
            bad("min_tokens", "must be >= 0")
        if num("min_new_tokens", True) < 0:
            bad("min_new_tokens", "must be >= 0")
        if self.min_new_tokens > self.max_new_tokens:
            bad(
                "min_new_tokens" if self.min_tokens is None else "min_tokens",
                f"must be <= max_new_tokens ({self.max_new_tokens})",
            )
        if num("temperature") < 0:
            bad("temperature", "must be >= 0")
        if not 0 < num("top_p") <= 1:
            bad("top_p", "must be in (0, 1]")
        if num("top_k", True) < 1 and self.top_k != -1:
            bad("top_k", "must be -1 (all) or >= 1")
        if not 0 <= num("min_p") <= 1:
            bad("min_p", "must be in [0, 1]")
        if not -2 <= num("frequency_penalty") <= 2:
            bad("frequency_penalty", "must be in [-2, 2]")
        if not -2 <= num("presence_penalty") <= 2:
            bad("presence_penalty", "must be in [-2, 2]")
        if not 0 < num("repetition_penalty") <= 2:
            bad("repetition_penalty", "must be in (0, 2]")
        if num("n", True) < 1:
            bad("n", "must be >= 1")
        if self.seed is not None and (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or not -_INT64 <= self.seed < _INT64
        ):
            bad("seed", "must be a 64-bit integer")
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
                bad("stop", "must be a non-empty string or a list of them")
            check_count_and_lengths("stop", stops)
        if self.stop_regex is not None and not isinstance(self.stop_regex, (str, list)):
            bad("stop_regex", "must be a regex string or a list of them")
        for p in self.stop_regex_list:
            if not isinstance(p, str) or not p:
                bad("stop_regex", "must be a non-empty regex string or a list of them")
        check_count_and_lengths("stop_regex", self.stop_regex_list)
        for p in self.stop_regex_list:
            check_stop_regex(p)
        if self.stream_interval is not None and (num("stream_interval", True) < 1):
            bad("stream_interval", "must be >= 1")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                bad("logit_bias", "must be an object of token id -> bias")
            for k, v in self.logit_bias.items():
                try:
                    t = int(k)
                except (TypeError, ValueError):
                    raise SamplingParamsError(
                        f"sampling_params.logit_bias key {brief_repr(k)} is not a token id"
                    ) from None
                if t < 0 or (vocab_size is not None and t >= vocab_size):
                    raise SamplingParamsError(
                        f"sampling_params.logit_bias key {brief_repr(k)} must be a token id in "
                        f"[0, {vocab_size if vocab_size is not None else 'vocab size'})"
                    )
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not finite32(v):
                    raise SamplingParamsError(
                        f"sampling_params.logit_bias[{brief_repr(k)}] must be a finite number of at"
                        f" most {FLOAT32_MAX:.3g} in magnitude, got {brief_repr(v)}"
                    )
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            if not isinstance(ids, list) or not all(isinstance(t, int) and t >= 0 for t in ids):
                bad("stop_token_ids", "must be a list of non-negative token ids")
            if vocab_size is not None and any(t >= vocab_size for t in ids):
                bad("stop_token_ids", f"must be < vocab size {vocab_size}")
        for name in ("regex", "ebnf"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                bad(name, "must be a string")
        for name in ("json_schema", "structural_tag"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), (str, dict)):
                bad(name, "must be a JSON string or an object")
        given = [n for n in _GRAMMAR_FIELDS if getattr(self, n) is not None]
        if len(given) > 1:
            raise SamplingParamsError(
                f"only one of {', '.join(_GRAMMAR_FIELDS)} may be given, got {', '.join(given)}"
            )
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "no_stop_trim",
        ):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be a boolean")
        self._verify_extra_samplers(vocab_size, bad, num)
        if self.max_thinking_tokens is not None and num("max_thinking_tokens", True) < 0:
            bad("max_thinking_tokens", "must be >= 0")
        if not isinstance(self.require_reasoning, bool):
            bad("require_reasoning", "must be a boolean")

    def _merge_budget_aliases(self) -> None:
        """One budget from its spellings (and SGLang's custom_params.thinking_budget); they must
        agree."""
        given = {
            n: getattr(self, n)
            for n in ("max_thinking_tokens", *_BUDGET_ALIASES)
            if getattr(self, n) is not None
        }
        if (
            isinstance(self.custom_params, dict)
            and self.custom_params.get("thinking_budget") is not None
        ):
            given["custom_params.thinking_budget"] = self.custom_params["thinking_budget"]
        for n, v in given.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SamplingParamsError(
                    f"sampling_params.{n} must be an integer >= 0, got {brief_repr(v)}"
                )
        if len(set(given.values())) > 1:
            raise SamplingParamsError(
                f"sampling_params.{', '.join(given)} differ; give one of them"
            )
        if given:
            self.max_thinking_tokens = next(iter(given.values()))

    @property
    def thinks(self) -> bool:
        """The request starts inside a think block (constrained/thinking.py)."""
        return self.require_reasoning or self.max_thinking_tokens is not None

    def _verify_extra_samplers(self, vocab_size, bad, num) -> None:
        if not 0 < num("typical_p") <= 1:
            bad("typical_p", "must be in (0, 1]")
        if num("dry_multiplier") < 0:
            bad("dry_multiplier", "must be >= 0")
        if num("dry_base") < 1:
            bad("dry_base", "must be >= 1")
        if num("dry_allowed_length", True) < 1:
            bad("dry_allowed_length", "must be >= 1")
        if num("dry_penalty_last_n", True) < -1:
            bad("dry_penalty_last_n", "must be -1 (the whole context), 0 (off) or a token count")
        for name in ("xtc_probability", "xtc_threshold"):
            if not 0 <= num(name) <= 1:
                bad(name, "must be in [0, 1]")
        if self.bad_words is not None:
            words = self.bad_words_list
            if not isinstance(self.bad_words, (str, list)) or not all(
                isinstance(w, str) and w.strip() for w in words
            ):
                bad("bad_words", "must be a list of non-blank strings")
            if len(words) > MAX_BAD_WORDS or any(len(w) > MAX_STOP_LEN for w in words):
                bad(
                    "bad_words",
                    f"may hold at most {MAX_BAD_WORDS} words of at most {MAX_STOP_LEN} characters",
                )
        if self.dry_sequence_breakers is not None:
            br = self.dry_sequence_breakers
            if not isinstance(br, list) or not all(isinstance(b, str) and b for b in br):
                bad("dry_sequence_breakers", "must be a list of non-empty strings")
            if len(br) > MAX_STOPS or any(len(b) > MAX_DRY_BREAKER_LEN for b in br):
                bad(
                    "dry_sequence_breakers",
                    f"may hold at most {MAX_STOPS} strings of at most "
                    f"{MAX_DRY_BREAKER_LEN} characters",
                )
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if (
                not isinstance(ids, list)
                or not ids
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
            ):
                bad("allowed_token_ids", "must be a non-empty list of token ids")
            if vocab_size is not None and max(ids) >= vocab_size:
                bad("allowed_token_ids", f"must be token ids < vocab size {vocab_size}")

    @property
    def bad_words_list(self) -> list[str]:
        return [self.bad_words] if isinstance(self.bad_words, str) else (self.bad_words or [])

    @property
    def dry_active(self) -> bool:
        return self.dry_multiplier > 0 and self.dry_penalty_last_n != 0

    @property
    def xtc_active(self) -> bool:
        return (
            self.xtc_probability > 0 and self.xtc_threshold <= 0.5
        )  # above 0.5 no two tokens qualify

    @property
    def uses_history_samplers(self) -> bool:
        """bad_words or DRY: a step's sampling needs the tokens of the step before it (no
        overlap)."""
        return bool(self.bad_words) or self.dry_active

    @functools.cached_property
    def uses_extra_samplers(self) -> bool:
        """Any of typical_p, bad_words, allowed_token_ids, DRY, XTC (else the sampler skips them
        all). Read every step for every row: computed once (a request's parameters do not
        change)."""
        return (
            self.typical_p < 1
            or self.allowed_token_ids is not None
            or self.xtc_active
            or self.uses_history_samplers
        )

    @property
    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def stop_regex_list(self) -> list[str]:
        if self.stop_regex is None:
            return []
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)

    @functools.cached_property
    def stop_regex_window(self) -> int:
        """The most characters a stop_regex match can span, at most STOP_REGEX_WINDOW (a wider or
        unbounded pattern is searched in that many). Computed once per request (not a field:
        to_dict and equality ignore it)."""
        widths = [max_match_width(p) for p in self.stop_regex_list]
        return min(max(widths, default=0), STOP_REGEX_WINDOW)

    @property
    def grammar_key(self) -> tuple[str, str] | None:
        """(kind, text) of the output constraint, the compile cache's key; None if unconstrained."""
        if self.json_schema is not None:
            text = (
                self.json_schema
                if isinstance(self.json_schema, str)
                else json.dumps(self.json_schema)
            )
            return ("json", text)
        if self.regex is not None:
            return ("regex", self.regex)
        if self.ebnf is not None:
            return ("ebnf", self.ebnf)
        if self.structural_tag is not None:
            tag = self.structural_tag
            return ("structural_tag", tag if isinstance(tag, str) else json.dumps(tag))
        return None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
