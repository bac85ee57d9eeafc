"""Fill-in-the-middle prompts (completions' `suffix`, llama-server's /infill) from the tokenizer's
FIM tokens.

The tokens are found by their spellings, llama.cpp's list (llama-vocab.cpp: StarCoder / SmolLM /
Granite `<fim_prefix>`, Qwen-coder `<|fim_prefix|>`, ...) plus DeepSeek-coder's, or named by
SGLang's `--completion-template` (a built-in name or its JSON file). The layout is prefix-suffix-
middle, as llama-server builds it: [BOS] <PRE> prefix <SUF> suffix <MID>, token by token (each
piece encoded alone, so no text can merge with a FIM token or spell one).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixlm.server.api_common import HTTPError, ServerState

# Role -> spellings, in order of preference. pad / rep / sep are llama.cpp's end-of-generation
# tokens of a FIM model (FIM_PAD, FIM_REP, FIM_SEP); rep and sep also frame /infill's repo context.
FIM_SPELLINGS: dict[str, tuple[str, ...]] = {
    "pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
        "<｜fim▁begin｜>",
    ),
    "suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
        "<｜fim▁hole｜>",
    ),
    "mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<MID>",
        "<|code_middle|>",
        "<|middle|>",
        "<｜fim▁end｜>",
    ),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}

# SGLang's built-in completion templates (sglang/srt/parser/code_completion_parser.py) as
# (prefix, suffix, middle) tokens: its MIDDLE / END fim_position orders are both
# prefix-suffix-middle.
COMPLETION_TEMPLATES: dict[str, tuple[str, str, str]] = {
    "star_coder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "qwen_coder": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "deepseek_coder": ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
}

# llama-server's separator of /infill's extra chunks when the model has no FIM_SEP token.
_SNIPPET = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None
    bos: int | None = None  # written first when the tokenizer adds a BOS to its encodings

    @property
    def end_of_generation(self) -> list[int]:
        return [t for t in (self.pad, self.rep, self.sep) if t is not None]


def _template_tokens(spec: str) -> tuple[str, str, str]:
    if spec in COMPLETION_TEMPLATES and not os.path.exists(spec):
        return COMPLETION_TEMPLATES[spec]
    if not (spec.endswith(".json") and os.path.isfile(spec)):
        raise ValueError(
            f"--completion-template {spec!r} is neither a JSON file nor a built-in name "
            f"({', '.join(COMPLETION_TEMPLATES)})"
        )
    with open(spec, encoding="utf-8") as f:
        t = json.load(f)
    # SGLang's file: fim_begin_token, fim_middle_token, fim_end_token, fim_position MIDDLE | END
    try:
        begin, middle, end, position = (
            t["fim_begin_token"],
            t["fim_middle_token"],
            t["fim_end_token"],
            t["fim_position"],
        )
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"--completion-template {spec}: needs fim_begin_token, fim_middle_token, fim_end_token "
            f"and fim_position ({type(e).__name__}: {e})"
        ) from None
    if position not in ("MIDDLE", "END"):
        raise ValueError(
            f"--completion-template {spec}: fim_position must be MIDDLE or END, got {position!r}"
        )
    # MIDDLE: begin prefix middle suffix end; END: begin prefix end suffix middle.
    return (begin, middle, end) if position == "MIDDLE" else (begin, end, middle)


@functools.lru_cache(maxsize=4)
def fim_tokens(tokenizer, completion_template: str | None = None) -> FimTokens | None:
    """The tokenizer's FIM tokens (None: it has none); a ValueError when --completion-template names
    tokens the vocabulary lacks. Cached per tokenizer: the vocabulary is read once."""
    vocab = tokenizer.get_vocab()
    found = {
        role: next((vocab[s] for s in spellings if s in vocab), None)
        for role, spellings in FIM_SPELLINGS.items()
    }
    if completion_template:
        named = _template_tokens(completion_template)
        missing = [s for s in named if s not in vocab]
        if missing:
            raise ValueError(
                f"--completion-template {completion_template}: {', '.join(missing)} not in the"
                " model's vocabulary"
            )
        found.update(zip(("pre", "suf", "mid"), (vocab[s] for s in named)))
    if None in (found["pre"], found["suf"], found["mid"]):
        return None
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and tokenizer.encode("a")[:1] == [bos]
    return FimTokens(**found, bos=bos if adds_bos else None)


def no_fim_message(field: str) -> str:
    return (
        f"{field} needs a model with fill-in-the-middle tokens (e.g. <fim_prefix> <fim_suffix>"
        " <fim_middle>); this model's tokenizer has none"
    )


Ids = Sequence[int]


def psm_ids(
    fim: FimTokens, prefix: Ids, suffix: Ids, extra: Ids = (), prompt: Ids = ()
) -> list[int]:
    """llama-server's layout: extra context, [BOS], <PRE> prefix <SUF> suffix <MID> prompt."""
    bos = [fim.bos] if fim.bos is not None else []
    return [*extra, *bos, fim.pre, *prefix, fim.suf, *suffix, fim.mid, *prompt]


def repo_context_ids(
    fim: FimTokens, encode: Callable[[str], list[int]], chunks: Sequence[tuple[str, str]]
) -> list[int]:
    """/infill's input_extra as llama-server frames it: the repo-level pattern (<FIM_REP>myproject,
    then <FIM_SEP>filename and text per chunk, then <FIM_SEP>filename for the file being edited)
    where the model has those tokens, else the chunks' texts each after a snippet separator."""
    out: list[int] = []
    if fim.rep is not None:
        out += [fim.rep, *encode("myproject\n")]
    for filename, text in chunks:
        out += [fim.sep, *encode(filename + "\n")] if fim.sep is not None else encode(_SNIPPET)
        out += encode(text)
    if fim.sep is not None:
        out += [fim.sep, *encode("filename\n")]
    return out


async def fim_prompt_ids(state: ServerState, prompt: str | list, suffix: str) -> list[list[int]]:
    """Completions with a suffix: each prompt (text, or token ids) is the prefix. Text is encoded as
    other prompts are (special tokens in it count), the FIM layout's BOS included."""
    tm = state.tokenizer_manager
    fim = fim_tokens(tm.tokenizer, state.server_args.completion_template)
    if fim is None:
        raise HTTPError(400, no_fim_message("suffix"), param="suffix")
    prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt
    limit = (
        state.context_len * tm.max_token_chars
    )  # more characters cannot fit: refused before encoding
    if len(suffix) + max(len(x) if isinstance(x, str) else 0 for x in prompts) > limit:
        raise HTTPError(
            400,
            "the prompt and suffix have more characters than the context length "
            f"{state.context_len} tokens can hold",
            param="suffix",
        )

    def build() -> list[list[int]]:
        encode = functools.partial(tm.tokenizer.encode, add_special_tokens=False)
        after = encode(suffix)
        return [psm_ids(fim, encode(x) if isinstance(x, str) else x, after) for x in prompts]

    return await tm.tokenizer_pool.run(build, what="tokenizing the prompt")
