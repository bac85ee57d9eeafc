"""Structured generation: grammar backends that turn a JSON schema, regex or EBNF into
per-step vocab masks (and forced text for jump-forward)."""

from radixlm.constrained.base_grammar_backend import (
    ANY_JSON_OBJECT,
    GRAMMAR_KINDS,
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarKey,
    InvalidGrammar,
)

GRAMMAR_BACKENDS = ("xgrammar", "none")


def create_grammar_backend(
    name: str | None, tokenizer, vocab_size: int, **kwargs
) -> BaseGrammarBackend | None:
    """The backend called `name`, or None when structured generation is off ("none")."""
    if name in (None, "none"):
        return None
    if name == "xgrammar":
        try:
            from radixlm.constrained.xgrammar_backend import XGrammarBackend
        except (
            ImportError
        ) as e:  # imported lazily: radixlm runs without xgrammar when grammars are off
            raise ImportError(
                f"grammar backend 'xgrammar' needs the xgrammar package ({e}); install it with: pip"
                " install --no-deps xgrammar==0.2.8 && pip install apache-tvm-ffi pydantic numpy"
                " typing-extensions"
            ) from e
        return XGrammarBackend(tokenizer, vocab_size, **kwargs)
    raise ValueError(f"unknown grammar backend {name!r}; choose one of {GRAMMAR_BACKENDS}")


__all__ = [
    "ANY_JSON_OBJECT",
    "GRAMMAR_BACKENDS",
    "GRAMMAR_KINDS",
    "BaseGrammarBackend",
    "BaseGrammarObject",
    "GrammarKey",
    "InvalidGrammar",
    "create_grammar_backend",
]
