"""The checks of a request's sampling values that need no SamplingParams (a leaf module): numbers
the sampler can hold, the count and length of stop strings, and stop_regex patterns (valid,
matching no empty string, cheap to compile), with the error they raise and the short form of a
client's value in its message. SamplingParams.verify (sampling_params.py) runs them."""

from __future__ import annotations

import math
import re

import regex

from radixlm.stop_match import compile_stop_regex

try:  # Python 3.11+: sre_parse is deprecated
    import re._parser as sre_parse
    from re import _constants as sre_constants
except ImportError:  # pragma: no cover
    import sre_constants
    import sre_parse

# Stop conditions are checked for every generated token (stop_match.py): at most this many stop
# strings and stop_regex patterns each, of at most this many characters (OpenAI allows 4 stop
# strings; SGLang and vLLM set no bound).
MAX_STOPS = 16
MAX_STOP_LEN = 256
# A stop_regex's size once its counted repeats are written out: the `regex` module compiles
# `(a{1000}){1000}` to a million nodes (seconds; `((x{65535}){65535}){65535}` exhausts memory).
MAX_STOP_REGEX_UNROLLED = 10_000
FLOAT32_MAX = (
    3.4028234663852886e38  # the sampler's tensors are float32: larger numbers become inf there
)


def brief_repr(v) -> str:
    """repr of a client's value, cut short for an error message."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def finite32(v) -> bool:
    """A number the sampler can hold in float32 (a huge JSON integer does not even fit a float)."""
    try:
        return math.isfinite(v) and abs(v) <= FLOAT32_MAX
    except OverflowError:
        return False


class SamplingParamsError(ValueError):
    """A bad sampling parameter; the message names the field."""


def check_count_and_lengths(name: str, items: list) -> None:
    if len(items) > MAX_STOPS:
        raise SamplingParamsError(
            f"sampling_params.{name} may hold at most {MAX_STOPS} items, got {len(items)}"
        )
    for s in items:
        if len(s) > MAX_STOP_LEN:
            raise SamplingParamsError(
                f"sampling_params.{name} items may have at most {MAX_STOP_LEN} characters, "
                f"got one of {len(s)}: {brief_repr(s)}"
            )


_REPEATS = (
    sre_constants.MAX_REPEAT,
    sre_constants.MIN_REPEAT,
    getattr(sre_constants, "POSSESSIVE_REPEAT", None),
)


def _unrolled_size(items) -> int:
    """Nodes of a parsed pattern with each counted repeat written out min-count times (what the
    `regex` module compiles); capped early, the count can be astronomical."""
    size = 0
    for op, av in items:
        if op in _REPEATS:
            lo, _, sub = av
            size += max(lo, 1) * _unrolled_size(sub)
        elif op is sre_constants.SUBPATTERN:
            size += 1 + _unrolled_size(av[-1])
        elif op is sre_constants.BRANCH:
            size += 1 + sum(_unrolled_size(b) for b in av[1])
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            size += 1 + _unrolled_size(av[1])
        elif op is getattr(sre_constants, "ATOMIC_GROUP", None):
            size += 1 + _unrolled_size(av)
        elif op is sre_constants.GROUPREF_EXISTS:
            size += 1 + sum(_unrolled_size(b) for b in av[1:] if b is not None)
        else:
            size += 1
        if size > MAX_STOP_REGEX_UNROLLED:
            break
    return size


def check_stop_regex(p: str) -> None:
    """Valid for both `re`'s parser (its width bounds the search window) and the `regex` module
    (which matches it), matching no empty string, and cheap to compile."""
    try:
        parsed = sre_parse.parse(p)
    except re.error as e:
        raise SamplingParamsError(
            f"sampling_params.stop_regex {p!r} is not a valid regex: {e}"
        ) from None
    if parsed.getwidth()[0] == 0:
        raise SamplingParamsError(
            f"sampling_params.stop_regex must not match the empty string ({p!r} does)"
        )
    if _unrolled_size(parsed) > MAX_STOP_REGEX_UNROLLED:
        raise SamplingParamsError(
            f"sampling_params.stop_regex {brief_repr(p)} repeats too much: written out, its "
            f"counted repeats exceed {MAX_STOP_REGEX_UNROLLED} elements"
        )
    try:
        compile_stop_regex(p)
    except regex.error as e:
        raise SamplingParamsError(
            f"sampling_params.stop_regex {p!r} is not a valid regex: {e}"
        ) from None


def max_match_width(pattern: str) -> int:
    """The most characters a match of `pattern` can span (a huge number when unbounded)."""
    return sre_parse.parse(pattern).getwidth()[1]
