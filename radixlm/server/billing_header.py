"""Claude Code's billing line: the one volatile field of its /v1/messages prompts, normalized so
that the radix cache reuses a session's tools + instructions prefix (issue 92).

Claude Code (2.1.x) sends as its first system block a line of the shape

    x-anthropic-billing-header: cc_version=2.1.177.01c; cc_entrypoint=cli; cch=36ee5;

where `cch` (5 hex digits, a hash of the request body) and the version's 3-hex fingerprint change
on every request. Being the first tokens of the prompt, they make every turn miss the cache
entirely (llama.cpp PR #21793, vLLM PR #36829, SGLang PR #21064 met the same). Before templating,
a line of exactly that shape at the start of a system block gets fixed values for those two:
`cch=00000` (the placeholder Claude Code itself writes before its transport fills it in) and the
fingerprint `000`; the version, the entry point and every other byte stay. A line of any other
shape is left as it came. --disable-billing-header-normalization turns this off.
"""

from __future__ import annotations

import re

PREFIX = "x-anthropic-billing-header:"
# The whole line: "key=value;" pairs, each value without ";" or a line break.
_LINE = re.compile(r"x-anthropic-billing-header: ?(?:[A-Za-z0-9_-]+=[^;\n]*; ?)+(?=\n|$)")
_CCH = re.compile(r"(?<=[:; ]cch=)[0-9a-fA-F]+(?=;)")
_VERSION = re.compile(r"(?<=[:; ]cc_version=)(\d+\.\d+\.\d+\.)[0-9a-fA-F]{3}(?=;)")


def normalize_billing_header(text: str) -> str:
    """text with the volatile values of its leading billing line fixed (unchanged otherwise)."""
    if not text.startswith(PREFIX):
        return text
    m = _LINE.match(text)
    if m is None:
        return text
    line = _CCH.sub(lambda c: "0" * len(c.group()), m.group())
    line = _VERSION.sub(lambda v: v.group(1) + "000", line)
    return line + text[m.end() :]
