"""Jump-forward decoding: append the text a grammar forces (`{"name": "`) in one step.

The forced string is tokenized together with the last few generated tokens, so the
sequence the model sees is the canonical tokenization of the text (what it would have
produced itself), not the tokens of the two pieces glued together: SGLang dropped the
feature in 2025 over exactly that. Byte-level BPE merges never cross a pre-token
boundary, and re-encoding the last two tokens with the forced text covers the one
pre-token that can straddle the start; the last forced token, which can straddle the
end, is left to the model.
"""

from __future__ import annotations

from dataclasses import dataclass

RETOKENIZE_TOKENS = 2


@dataclass
class JumpForward:
    keep: int  # output tokens kept as they are
    new_tokens: list[int]  # replace output_ids[keep:]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def find_jump_forward(
    grammar, tokenizer, output_ids: list[int], max_replace: int, max_new: int
) -> JumpForward | None:
    """If the grammar forces text next, advance `grammar` over its canonical tokens and say how
    output_ids change; None (grammar untouched) when nothing is forced or it cannot be done.

    max_replace: how many trailing output tokens may be re-tokenized (not yet streamed, not
    shared with the cache); max_new: the most output tokens the request may end with."""
    forced = grammar.find_jump_forward_str()
    if not forced:
        return None
    k = min(RETOKENIZE_TOKENS, max_replace, len(output_ids))
    tail = output_ids[len(output_ids) - k :]
    tail_text = tokenizer.decode(tail) if k else ""
    if (
        "\ufffd" in tail_text
    ):  # a character split across tokens: its bytes cannot be re-encoded from text
        k, tail, tail_text = 0, [], ""
    text = tail_text + forced
    new = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.decode(new) != text:
        return None
    common = _common_prefix(tail, new)
    keep = len(output_ids) - k + common
    # The last forced token may merge with what comes after it (': ' + '"' is ' "' in the
    # model's own tokenization), so it is left for the model to generate.
    new = new[common:-1][: max(0, max_new - keep)]
    if not new:
        return None
    grammar.rollback(k - common)
    accepted = 0
    for t in new:
        if not grammar.accept_token(t):
            break
        accepted += 1
    if accepted < len(new):  # the grammar disagrees with the re-tokenization: undo everything
        grammar.rollback(accepted)
        for t in tail[common:]:
            grammar.accept_token(t)
        return None
    return JumpForward(keep, new)
