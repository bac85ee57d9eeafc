"""The `model` field of the OpenAI chat and completions routes.

SGLang serves whatever name a client sends (its docs and users' scripts send "default"; its
maintainers: the field is there for OpenAI compatibility), and reads `BASE:ADAPTER` as a LoRA
adapter (split at the first colon). radixlm does the same by default. --strict-model-name is vLLM's
check instead: a name that is neither the served name nor the model's path is a 404. /v1/models and
/v1/models/{id} list and check the served name either way. Every API's routes (OpenAI's,
Anthropic's, Ollama's, the embedding and rerank ones) resolve their `model` through requested_model.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

from radixlm.server.api_common import HTTPError, ServerState, served_model_name


class ModelNameError(Exception):
    """A 404 for the `model` field; the message names what is unknown."""


@dataclass(frozen=True)
class RequestedModel:
    name: str  # what the answer's `model` says: the client's name, as SGLang echoes it
    adapter: str | None = None  # the LoRA adapter after the colon (radixlm/lora/)


def resolve_requested_model(
    requested: str | None,
    served: str,
    known: Collection[str],
    strict: bool,
    adapters: Collection[str] = (),
) -> RequestedModel:
    """The model a request asks for; ModelNameError when it names an adapter that is not loaded or
    (strict) a model that is not served. `known`: the names of the served model (its served name,
    path, ...); `adapters`: the loaded LoRA adapters' names."""
    if requested is None or requested in known:
        return RequestedModel(requested or served)
    base, sep, adapter = requested.partition(":")
    adapter = adapter.strip()
    if strict and base.strip() not in known:
        raise ModelNameError(
            f"The model '{base.strip() if adapter else requested}' does not exist; this server "
            f"serves '{served}'."
        )
    if adapter and adapter not in adapters:
        loaded = f"the loaded ones: {', '.join(sorted(adapters))}" if adapters else "none is loaded"
        raise ModelNameError(
            f"The LoRA adapter '{adapter}' (model '{requested}') does not exist; {loaded}."
        )
    return RequestedModel(requested, adapter or None)


def known_model_names(state: ServerState) -> set:
    """The names of the served model: its served name, its path (and the path's last part)."""
    info = state.scheduler_info
    names = {
        served_model_name(state.server_args, info),
        info["model_path"],
        os.path.basename(info["model_path"]),
    }
    return names | ({state.server_args.model_path} if state.server_args.model_path else set())


def requested_model(state: ServerState, name: str | None) -> RequestedModel:
    """A request's `model` and its LoRA adapter (BASE:ADAPTER; or a loaded adapter's name alone, as
    SGLang): any name by default, as SGLang; a 404 where resolve_requested_model refuses it."""
    served = served_model_name(state.server_args, state.scheduler_info)
    adapters = state.tokenizer_manager.lora.adapter_names()
    known = known_model_names(state)
    if name in adapters and name not in known:
        return RequestedModel(name, name)
    try:
        return resolve_requested_model(
            name, served, known, state.server_args.strict_model_name, adapters
        )
    except ModelNameError as e:
        raise HTTPError(404, str(e), "not_found_error", "model") from None
