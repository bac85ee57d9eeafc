"""Registry: the one plug-in pattern. Every extension point (models, attention backends, prefix
caches, policies, speculative sources, grammar backends, parsers) is a Registry: names in
registration order, each with its entry (a class, a factory, an object; never a str) and optional
metadata that the point reads without loading the entry.

    @ROUTER_POLICY_REGISTRY.register("least_loaded")  # by decorator, or by a dotted path that is
    class LeastLoadedPolicy(Policy): ...              # imported at the first lookup:
    MODEL_REGISTRY.register("LlamaForCausalLM", "radixlm.model.models.llama:LlamaForCausalLM")

    MODEL_REGISTRY.get("LlamaForCausalLM")        # the class; an unknown name: UnknownNameError
    SCHEDULE_POLICY_REGISTRY.meta("lpm").cache_aware  # metadata, nothing imported
    ROUTER_POLICY_REGISTRY.names()                # a CLI option's choices

A leaf (no radixlm import, no torch): the router and the pure text parsers use it too.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast, overload

T = TypeVar("T")
M = TypeVar("M")

# The unknown-name message; its fields: kind, name, choices (joined by ", "), names (the tuple).
UNKNOWN = "unknown {kind} {name!r}; choose from {choices}"


class UnknownNameError(KeyError, ValueError):
    """A name no entry has: a KeyError to mapping-style callers, a ValueError to option checks."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class _Entry(Generic[T, M]):
    target: T | str  # the entry, or the dotted path it is imported from at the first lookup
    meta: M


_DOTTED = re.compile(r"\w+(\.\w+)*:\w+(\.\w+)*")


def import_dotted(path: str) -> Any:
    """The object a "package.module:attribute[.attribute]" path names."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T, M]):
    """Named entries of one kind. `kind` names them in errors ("attention backend"); `unknown` is
    the unknown-name message (the point's own wording, kept where callers and tests read it)."""

    def __init__(self, kind: str, unknown: str = UNKNOWN):
        self.kind = kind
        self._unknown = unknown
        self._entries: dict[str, _Entry[T, M]] = {}

    @overload
    def register(
        self, name: str, target: None = None, meta: M | None = None
    ) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, target: T | str, meta: M | None = None) -> None: ...

    def register(
        self, name: str, target: T | str | None = None, meta: M | None = None
    ) -> Callable[[T], T] | None:
        """Adds `name`: with a target (the entry, or a "module:attribute" string imported at the
        first lookup), now; without, as a decorator returning what it decorates. `meta`: what the
        point reads without loading the entry (None in a registry without metadata). A name
        registered twice is an error: two plug-ins would claim it."""
        if target is None:

            def decorator(obj: T) -> T:
                self.register(name, obj, meta)
                return obj

            return decorator
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        if isinstance(target, str) and not _DOTTED.fullmatch(target):
            raise ValueError(f"a lazy {self.kind} is 'package.module:attribute', got {target!r}")
        self._entries[name] = _Entry(target, cast(M, meta))
        return None

    def get(self, name: str) -> T:
        """The entry of `name` (its dotted path imported once, now); UnknownNameError if none."""
        entry = self._entry(name)
        if isinstance(entry.target, str):
            entry.target = cast(T, import_dotted(entry.target))
        return cast(T, entry.target)

    def meta(self, name: str) -> M:
        """The metadata of `name`, without loading its entry."""
        return self._entry(name).meta

    def names(self) -> tuple[str, ...]:
        """Every name, in registration order (an option's choices; auto's order of preference)."""
        return tuple(self._entries)

    def unknown(self, name: object) -> UnknownNameError:
        """The error for a name no entry has, listing the choices (for callers that look up by a
        key of their own, e.g. lower-cased)."""
        names = self.names()
        message = self._unknown.format(
            kind=self.kind, name=name, choices=", ".join(names), names=names
        )
        return UnknownNameError(message)

    def _entry(self, name: str) -> _Entry[T, M]:
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise self.unknown(name) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __delitem__(self, name: str) -> None:
        """Unregisters `name` (a test's temporary entry)."""
        self._entry(name)
        del self._entries[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"
