"""radixlm.lang: LLM programs in the style of SGLang's frontend.

from radixlm.lang import function, gen, select, user, assistant, RuntimeEndpoint,
set_default_backend
"""

from radixlm.lang.base_backend import BaseBackend, get_default_backend, set_default_backend
from radixlm.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.function import SglFunction, function
from radixlm.lang.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixlm.lang.state import ForkGroup, ProgramState

# backends import on first use: RuntimeEndpoint needs requests, EngineBackend torch, OpenAI openai
_LAZY = {
    "RuntimeEndpoint": "radixlm.lang.runtime_endpoint",
    "Runtime": "radixlm.lang.runtime_endpoint",
    "EngineBackend": "radixlm.lang.engine_backend",
    "OpenAI": "radixlm.lang.openai_backend",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


def flush_cache(backend: BaseBackend | None = None) -> None:
    """Empty the default (or given) backend's prefix cache."""
    (backend or get_default_backend()).flush_cache()


__all__ = [
    "function",
    "SglFunction",
    "gen",
    "gen_int",
    "gen_string",
    "select",
    "image",
    "system",
    "user",
    "assistant",
    "system_begin",
    "system_end",
    "user_begin",
    "user_end",
    "assistant_begin",
    "assistant_end",
    "ProgramState",
    "ForkGroup",
    "BaseBackend",
    "RuntimeEndpoint",
    "Runtime",
    "EngineBackend",
    "OpenAI",
    "flush_cache",
    "set_default_backend",
    "get_default_backend",
    "token_length_normalized",
    "greedy_token_selection",
    "unconditional_likelihood_normalized",
]
