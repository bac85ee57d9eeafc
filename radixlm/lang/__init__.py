"""radixlm.lang: LLM programs in the style of SGLang's frontend.

    from radixlm.lang import function, gen, select, user, assistant, RuntimeEndpoint, set_default_backend
"""

from radixlm.lang.base_backend import BaseBackend, get_default_backend, set_default_backend
from radixlm.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.function import SglFunction, function
from radixlm.lang.ir import (
    assistant, assistant_begin, assistant_end, gen, gen_int, gen_string, image, select, system, system_begin,
    system_end, user, user_begin, user_end,
)
from radixlm.lang.state import ForkGroup, ProgramState


def __getattr__(name):
    # Backends import lazily: RuntimeEndpoint needs requests, EngineBackend torch.
    if name == "RuntimeEndpoint":
        from radixlm.lang.runtime_endpoint import RuntimeEndpoint

        return RuntimeEndpoint
    if name in ("EngineBackend", "Runtime"):
        from radixlm.lang.engine_backend import EngineBackend

        return EngineBackend
    raise AttributeError(name)


__all__ = [
    "function", "SglFunction", "gen", "gen_int", "gen_string", "select", "image", "system", "user", "assistant",
    "system_begin", "system_end", "user_begin", "user_end", "assistant_begin", "assistant_end", "ProgramState",
    "ForkGroup", "BaseBackend", "RuntimeEndpoint", "EngineBackend", "set_default_backend", "get_default_backend",
    "token_length_normalized", "greedy_token_selection", "unconditional_likelihood_normalized",
]
