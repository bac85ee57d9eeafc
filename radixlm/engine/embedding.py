"""Embedding requests (--is-embedding): `/v1/embeddings`, SGLang's `/encode`, `Engine.encode`.

An embedding is a prefill-only request (max_new_tokens 0) through the same scheduler as generation:
batched with the others, last-token pooling reusing cached prefixes; the scheduler returns the
pooled, normalized final hidden state with the request's last chunk (model/pooler.py), which the
TokenizerManager keeps in the request's meta_info. `embed` here makes the requests of an `input`
and reads their embeddings back. The TokenizerManager keeps the two kinds of server apart: an
embedding server refuses generation, a generation server refuses embeddings (each a 400).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.engine.tokenizer_manager import TokenizerManager
from radixlm.ipc import EmbeddingReqInput

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingError(ValueError):
    """A bad embedding request; `param` names the field (OpenAI's error.param)."""

    def __init__(self, message: str, param: str | None = "input"):
        super().__init__(message)
        self.param = param


@dataclass
class EmbeddingResult:
    embeddings: list[list[float]]  # per input, in order
    meta_infos: list[dict]  # per input: SGLang's meta_info (prompt_tokens, cached_tokens, ...)

    @property
    def prompt_tokens(self) -> int:
        return sum(m["prompt_tokens"] for m in self.meta_infos)


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def embedding_items(inp: Any, field: str = "input") -> tuple[list[str | list[int]], bool]:
    """OpenAI's `input` (str | list[str] | list[int] | list[list[int]]) as a list of items, and
    whether it was a single one. field: the request's name for it (errors name it)."""
    if isinstance(inp, str):
        items, single = [inp], True
    elif _is_ids(inp) and inp:
        items, single = [inp], True
    elif (
        isinstance(inp, list)
        and inp
        and (all(isinstance(x, str) for x in inp) or all(_is_ids(x) for x in inp))
    ):
        items, single = list(inp), False
    else:
        raise EmbeddingError(
            f"{field} must be a non-empty string, a list of strings, a list of token ids or a list "
            "of such lists",
            field,
        )
    for i, item in enumerate(items):
        if len(item) == 0:
            raise EmbeddingError(f"{field}{'' if single else f'[{i}]'} is empty", field)
    return items, single


def _embedding_ids(
    tm: TokenizerManager, items: list[str | list[int]], single: bool, field: str
) -> list[list[int]]:
    out = []
    for i, item in enumerate(items):
        name = field if single else f"{field}[{i}]"
        if isinstance(item, str):
            try:
                ids = tm.encode_prompt(item)
            except ValueError as e:
                raise EmbeddingError(f"{name}: {e}", field) from None
        else:
            ids = item
            bad = [t for t in ids if not 0 <= t < tm.vocab_size]
            if bad:
                raise EmbeddingError(
                    f"{name} has token id {bad[0]} outside the vocabulary [0, {tm.vocab_size})",
                    field,
                )
        if not ids:
            raise EmbeddingError(f"{name} is empty after tokenization", field)
        if len(ids) >= tm.context_len:
            raise EmbeddingError(
                f"{name} has {len(ids)} tokens, which does not fit the context length "
                f"{tm.context_len}",
                field,
            )
        out.append(ids)
    return out


async def embed(
    tm: TokenizerManager,
    inp: EmbeddingInput,
    dimensions: int | None = None,
    rid: Any = None,
    admit: Callable[[int], None] | None = None,
    field: str = "input",
) -> EmbeddingResult:
    """The normalized embedding of each input (EmbeddingError: a 400 naming the field, `field` for
    the input: OpenAI's `input`, SGLang's `text` / `input_ids`)."""
    if not tm.is_embedding:
        raise EmbeddingError(
            "this server serves a generation model: embeddings need an embedding model served "
            "with --is-embedding",
            param=None,
        )
    if (tm.scheduler_info.get("reranker") or {}).get("kind") == "cross_encoder":
        raise EmbeddingError(
            "this server serves a cross-encoder reranker: its scores come from /v1/rerank",
            param=None,
        )
    hidden = tm.scheduler_info.get("hidden_size")
    if dimensions is not None and dimensions != hidden:  # no served model declares Matryoshka sizes
        raise EmbeddingError(
            f"dimensions {dimensions!r}: this model's embeddings have {hidden} dimensions and"
            " it declares no other sizes (Matryoshka)",
            param="dimensions",
        )
    items, single = embedding_items(inp, field)
    ids = await tm.tokenizer_pool.run(_embedding_ids, tm, items, single, field)
    obj = EmbeddingReqInput(
        input_ids=ids,
        sampling_params={"max_new_tokens": 0},
        rid=[rid] if isinstance(rid, str) else rid,
    )
    outs: list = []
    async for outs in tm.generate_request(obj, admit):  # noqa: B007 (the last item is the result)
        pass
    metas = [dict(o["meta_info"]) for o in outs]
    return EmbeddingResult([m.pop("embedding") for m in metas], metas)
