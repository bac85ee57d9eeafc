"""LoRAConfig: SGLang's LoRA flags, validated (built from ServerArgs; None when LoRA is off)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.config import ServerArgs

# SGLang's --lora-backend values, all accepted: every one runs the same segmented torch compute here
# (per target layer, the batch's tokens grouped by adapter: shrink x A^T, then expand by B^T).
LORA_BACKENDS = ("csgmv", "triton", "torch_native", "flashinfer", "ascend")
EVICTION_POLICIES = ("lru", "fifo")
# HF projection names an adapter may target; SGLang's fused names and `all` stand for their parts.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_TARGET_ALIASES = {
    "all": TARGET_MODULES,
    "all-linear": TARGET_MODULES,
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


@dataclass(frozen=True)
class LoRARef:
    """An adapter to serve: its name (what requests say), its peft directory, whether it is
    pinned."""

    lora_name: str
    lora_path: str
    pinned: bool = False


def parse_lora_path(entry: Any) -> LoRARef:
    """One --lora-paths entry (SGLang's forms): NAME=PATH, PATH (named by itself), or a JSON object
    {"lora_name", "lora_path", "pinned"} (as a string or a dict)."""
    if isinstance(entry, str) and entry.lstrip().startswith("{"):
        try:
            entry = json.loads(entry)
        except json.JSONDecodeError as e:
            raise ValueError(f"lora_paths: {entry!r} is not valid JSON ({e})") from None
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"lora_name", "lora_path", "pinned"})
        name, path, pinned = (
            entry.get("lora_name"),
            entry.get("lora_path"),
            entry.get("pinned", False),
        )
        if (
            unknown
            or not isinstance(name, str)
            or not isinstance(path, str)
            or not isinstance(pinned, bool)
        ):
            raise ValueError(
                f"lora_paths: {entry!r} needs string lora_name and lora_path and a boolean pinned"
                + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            )
        return LoRARef(check_name(name), path, pinned)
    if not isinstance(entry, str) or not entry:
        raise ValueError(f"lora_paths: entries are NAME=PATH, PATH or JSON objects, got {entry!r}")
    name, sep, path = entry.partition("=")
    return LoRARef(check_name(name), path) if sep else LoRARef(check_name(entry), entry)


def check_name(name: Any, field: str = "lora_name") -> str:
    # A colon would make "BASE:ADAPTER" ambiguous on the OpenAI routes.
    if not isinstance(name, str) or not name or ":" in name or len(name) > 256:
        raise ValueError(
            f"{field} must be a non-empty string of at most 256 characters without ':', got"
            f" {name!r}"
        )
    return name


def expand_targets(names) -> frozenset[str]:
    out = set()
    for n in names:
        if n not in TARGET_MODULES and n not in _TARGET_ALIASES:
            raise ValueError(
                f"lora_target_modules: unknown module {n!r} (one of {', '.join(TARGET_MODULES)}, "
                "qkv_proj, gate_up_proj or all)"
            )
        out.update(_TARGET_ALIASES.get(n, (n,)))
    return frozenset(out)


@dataclass(frozen=True)
class LoRAConfig:
    adapters: tuple[LoRARef, ...] = ()  # loaded at start (--lora-paths)
    max_loras_per_batch: int = 8  # distinct adapters in one batch, the base model counting as one
    max_loaded_loras: int | None = None  # adapters held in memory at once; None: no limit
    max_lora_rank: int | None = None  # None: the largest rank of `adapters`
    target_modules: frozenset[str] | None = None  # None: the union of `adapters`' targets
    eviction_policy: str = "lru"
    backend: str = "csgmv"

    def __post_init__(self):
        if self.max_loras_per_batch < 1:
            raise ValueError(f"max_loras_per_batch must be >= 1, got {self.max_loras_per_batch}")
        if self.max_loaded_loras is not None and self.max_loaded_loras < max(1, len(self.adapters)):
            raise ValueError(
                f"max_loaded_loras ({self.max_loaded_loras}) must be >= 1 and hold the "
                f"{len(self.adapters)} adapter(s) of lora_paths"
            )
        if self.max_lora_rank is not None and self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"lora_eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, "
                f"got {self.eviction_policy!r}"
            )
        if self.backend not in LORA_BACKENDS:
            raise ValueError(
                f"lora_backend must be one of {', '.join(LORA_BACKENDS)}, got {self.backend!r}"
            )
        names = [a.lora_name for a in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"lora_paths names an adapter twice: {names}")
        pinned = sum(a.pinned for a in self.adapters)
        if pinned > self.max_loras_per_batch - 1:  # the base model and the others need a slot too
            raise ValueError(
                f"lora_paths pins {pinned} adapters; at most max_loras_per_batch - 1 "
                f"({self.max_loras_per_batch - 1}) may be pinned"
            )
        if not self.adapters and (self.max_lora_rank is None or self.target_modules is None):
            raise ValueError(
                "enable_lora without lora_paths needs max_lora_rank and lora_target_modules "
                "(they size the adapter slots; SGLang's rule)"
            )

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> LoRAConfig | None:
        paths = args.lora_paths
        if isinstance(paths, str):  # the Engine / a config file may give one string
            paths = [paths]
        if not args.enable_lora and not paths:
            return None
        # What the hooks on the Python layers do not reach (yet): refused, not silently wrong.
        for on, flag in (
            (args.tp_size > 1, "tp_size > 1"),
            (args.pp_size > 1, "pp_size > 1"),
            (args.is_embedding, "is_embedding"),
            (args.speculative_algorithm, "speculative_algorithm"),
            (args.enable_torch_compile, "enable_torch_compile"),
        ):
            if on:
                raise ValueError(f"enable_lora does not work with {flag} yet")
        targets = args.lora_target_modules
        if isinstance(targets, str):
            targets = [targets]
        return cls(
            adapters=tuple(parse_lora_path(p) for p in paths or ()),
            max_loras_per_batch=args.max_loras_per_batch,
            max_loaded_loras=args.max_loaded_loras,
            max_lora_rank=args.max_lora_rank,
            target_modules=expand_targets(targets) if targets else None,
            eviction_policy=args.lora_eviction_policy,
            backend=args.lora_backend,
        )
