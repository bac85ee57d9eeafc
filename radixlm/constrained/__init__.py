"""Structured generation: grammar backends that turn a JSON schema, regex or EBNF into
per-step vocab masks (and forced text for jump-forward)."""

from collections.abc import Callable
from dataclasses import dataclass

from radixlm.constrained.base_grammar_backend import (
    ANY_JSON_OBJECT,
    GRAMMAR_KINDS,
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarKey,
    InvalidGrammar,
)
from radixlm.registry import Registry

GrammarBackendFactory = Callable[..., BaseGrammarBackend | None]  # (tokenizer, vocab_size, **kw)


@dataclass(frozen=True)
class GrammarBackendInfo:
    """A backend's package, imported with it (radixlm runs without it when grammars are off)."""

    package: str | None = None
    install: str = ""  # how to install the package


def _no_grammar_backend(tokenizer, vocab_size: int, **kwargs) -> None:
    return None  # "none": structured generation off


# --grammar-backend, its choices in this order.
GRAMMAR_BACKEND_REGISTRY = Registry[GrammarBackendFactory, GrammarBackendInfo](
    "grammar backend", unknown="unknown grammar backend {name!r}; choose one of {names}"
)
GRAMMAR_BACKEND_REGISTRY.register(
    "xgrammar",
    "radixlm.constrained.xgrammar_backend:XGrammarBackend",
    GrammarBackendInfo(
        "xgrammar",
        "pip install --no-deps xgrammar==0.2.8 && pip install apache-tvm-ffi pydantic numpy"
        " typing-extensions",
    ),
)
GRAMMAR_BACKEND_REGISTRY.register("none", _no_grammar_backend, GrammarBackendInfo())


def create_grammar_backend(
    name: str | None, tokenizer, vocab_size: int, **kwargs
) -> BaseGrammarBackend | None:
    """The backend called `name`, or None when structured generation is off ("none")."""
    name = "none" if name is None else name
    try:
        factory = GRAMMAR_BACKEND_REGISTRY.get(name)
    except ImportError as e:  # the backend's package is missing
        info = GRAMMAR_BACKEND_REGISTRY.meta(name)
        raise ImportError(
            f"grammar backend {name!r} needs the {info.package} package ({e}); install it with:"
            f" {info.install}"
        ) from e
    return factory(tokenizer, vocab_size, **kwargs)


__all__ = [
    "ANY_JSON_OBJECT",
    "GRAMMAR_BACKEND_REGISTRY",
    "GRAMMAR_KINDS",
    "BaseGrammarBackend",
    "BaseGrammarObject",
    "GrammarKey",
    "InvalidGrammar",
    "create_grammar_backend",
]
