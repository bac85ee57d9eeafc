"""llama-server's /completion request (its tools/server/README.md) and how its fields become
radixlm's sampling parameters: llama-server's names (n_predict, repeat_penalty, grammar in GBNF,
n_probs) mapped to SGLang's, its "off" spellings (seed -1, top_k <= 0, temperature < 0) to
radixlm's. A field left out gets radixlm's default (the server's --sampling-defaults), not
llama-server's; /props reports those."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from radixlm.constrained.gbnf import GBNFError, check_gbnf
from radixlm.sampling_params import SamplingParams
from radixlm.server.api_common import HTTPError
from radixlm.server.sampling_builder import ClientNames, build_sampling_params

_PROMPT = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
    ]
}
# llama-server's "random seed" spellings: -1 and LLAMA_DEFAULT_SEED (0xFFFFFFFF).
_RANDOM_SEEDS = (-1, 0xFFFFFFFF)


class CompletionRequest(BaseModel):
    """/completion's fields radixlm serves; any other field is a 400 naming it."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: Any = Field(json_schema_extra=_PROMPT)
    n_predict: int = Field(-1, ge=-1)  # -1: up to the end of the context
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    seed: int | None = None
    stop: list[str] = []
    ignore_eos: bool | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    grammar: str | None = None  # GBNF
    json_schema: dict | None = None
    n_probs: int = Field(0, ge=0)
    stream: bool = False
    return_tokens: bool = False
    id_slot: int = Field(-1, ge=-1)  # -1: an idle slot (llama_slots.py)
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    model: str | None = None  # echoed back
    # Accepted and ignored: the radix cache always reuses a cached prefix (cache_prompt), the
    # penalties look at the whole output (repeat_last_n), the sampler order is radixlm's; time
    # limits, indentation stops, min_keep, timings per token and field selection are not done.
    cache_prompt: bool | None = None
    repeat_last_n: int | None = None
    samplers: list[str] | None = None
    min_keep: int | None = None
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None
    n_indent: int | None = None
    timings_per_token: bool | None = None
    response_fields: list[str] | None = None


# llama-server's names of SGLang's sampling fields (those spelled alike map to themselves).
NATIVE = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "ignore_eos": "ignore_eos",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "dry_multiplier": "dry_multiplier",
    "dry_base": "dry_base",
    "dry_allowed_length": "dry_allowed_length",
    "dry_penalty_last_n": "dry_penalty_last_n",
    "dry_sequence_breakers": "dry_sequence_breakers",
    "xtc_probability": "xtc_probability",
    "xtc_threshold": "xtc_threshold",
}
_LLAMA_NAME = {v: k for k, v in NATIVE.items()} | {"max_new_tokens": "n_predict", "ebnf": "grammar"}


def _llama_value(name: str, v: Any) -> Any:
    """llama-server's spellings of "off" as radixlm's."""
    if name == "seed" and v in _RANDOM_SEEDS:
        return None
    if name == "top_k" and isinstance(v, int) and v <= 0:
        return -1
    if name == "temperature" and isinstance(v, (int, float)) and v < 0:
        return 0.0  # llama-server: greedy
    return v


def sampling_params(req: CompletionRequest, room: int, vocab_size: int) -> dict:
    """The request's SGLang sampling parameters (only what it set); `room`: the context left after
    the prompt. A refused value is a 400 naming llama-server's field."""
    then: dict[str, Any] = {"stop": req.stop} if req.stop else {}
    if req.grammar is not None and req.json_schema is not None:
        raise HTTPError(400, "give either grammar or json_schema, not both", param="grammar")
    if req.grammar:
        try:
            then["ebnf"] = check_gbnf(req.grammar)
        except GBNFError as e:
            msg = f"grammar is not a valid GBNF grammar: {e}"
            raise HTTPError(400, msg, param="grammar") from None
    if req.json_schema is not None:
        then["json_schema"] = json.dumps(req.json_schema)
    return build_sampling_params(
        req,
        NATIVE,
        vocab_size,
        ClientNames(_LLAMA_NAME),
        first={"max_new_tokens": room if req.n_predict < 0 else min(req.n_predict, room)},
        then=then,
        value=_llama_value,
    )


def generation_settings(sp: dict, defaults: dict, n_ctx: int, extra: dict) -> dict:
    """llama-server's generation_settings: the values a request runs with (what it set, else the
    server's defaults), in llama-server's names."""
    eff = SamplingParams.from_dict({**defaults, **sp})
    out = {name: getattr(eff, native) for name, native in NATIVE.items()}
    out["dry_sequence_breakers"] = eff.dry_sequence_breakers or ["\n", ":", '"', "*"]
    out["seed"] = 0xFFFFFFFF if eff.seed is None else eff.seed
    out["n_predict"] = eff.max_new_tokens
    out["stop"] = [eff.stop] if isinstance(eff.stop, str) else list(eff.stop or [])
    out["grammar"] = sp.get("ebnf", "")
    return {"n_ctx": n_ctx, **out, **extra}


def finished_fields(
    prompt_ids: list[int], out: dict, content: str, tokens: list[int], text: str, context_len: int
) -> dict:
    """The fields of llama-server's last /completion (and /infill) answer that come from the
    finished request: its content and tokens, the prompt as text, why it stopped, the counts."""
    meta = out["meta_info"]
    fr = meta["finish_reason"] or {}
    matched = fr.get("matched")
    stop_type = {"length": "limit", "stop": "word" if isinstance(matched, str) else "eos"}.get(
        fr.get("type"), "none"
    )
    return {
        "index": 0,
        "content": content,
        "tokens": tokens,
        "stop": True,
        "prompt": text,
        "stop_type": stop_type,
        "stopping_word": matched if isinstance(matched, str) else "",
        "tokens_predicted": meta["completion_tokens"],
        "tokens_evaluated": meta["prompt_tokens"],
        "tokens_cached": meta.get("cached_tokens", 0),
        "truncated": (
            stop_type == "limit" and len(prompt_ids) + meta["completion_tokens"] >= context_len
        ),
    }
