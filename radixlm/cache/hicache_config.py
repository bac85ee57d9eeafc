"""HiCacheConfig: the hierarchical cache's options (SGLang's --hicache-* flags), validated here,
where their choices live."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixlm.registry import Registry

if TYPE_CHECKING:
    from radixlm.config import ServerArgs

HICACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")  # host_pool.py: host_dtype_for
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
# --hicache-storage-backend: L3 behind get / exists / set, each entry a storage.py: HiCacheStorage
# made as entry(directory, model_key, layout, max_bytes, stats, storage_key) (storage.py:
# create_storage; a module imported only when its backend is chosen).
STORAGE_BACKEND_REGISTRY = Registry[Callable[..., Any], None](
    "hicache storage backend", unknown="unknown hicache storage backend {name!r} (known: {choices})"
)
STORAGE_BACKEND_REGISTRY.register("file", "radixlm.cache.storage:HiCacheFile")
STORAGE_BACKEND_REGISTRY.register("mooncake", "radixlm.cache.storage_mooncake:HiCacheMooncake")
EXTRA_CONFIG = ("mooncake",)  # the backends that take --hicache-storage-backend-extra-config
STORAGE_KEY_ENV = "RADIXLM_HICACHE_STORAGE_KEY"  # the key without putting it on a command line
MIN_KEY_CHARS = 16


@dataclass(frozen=True)
class HiCacheConfig:
    ratio: float = 2.0  # L2 size as a multiple of the KV pool (when size_gb is 0)
    size_gb: float = 0.0
    write_policy: str = "write_through"
    dtype: str = "auto"  # L2/L3 element type; auto: float16 for a float32 L1, else L1's
    storage_backend: str | None = None  # L3; None: none
    storage_dir: str = ""
    storage_size_gb: float = 16.0  # 0: unbounded
    storage_chunk_size: int = 64  # tokens per stored chunk
    storage_key: str | None = field(default=None, repr=False)  # None: the directory's key file
    # --hicache-storage-backend-extra-config's JSON object, for backends that read one (mooncake).
    storage_extra_config: dict | None = None

    def __post_init__(self):
        def bad(field: str, why: str):
            raise ValueError(f"hicache_{field} {why}, got {getattr(self, field)!r}")

        if self.write_policy not in WRITE_POLICIES:
            bad("write_policy", f"must be one of {', '.join(WRITE_POLICIES)}")
        if self.dtype not in HICACHE_DTYPES:
            bad("dtype", f"must be one of {', '.join(HICACHE_DTYPES)}")
        if (
            self.storage_backend is not None
            and self.storage_backend not in STORAGE_BACKEND_REGISTRY
        ):
            choices = ", ".join(STORAGE_BACKEND_REGISTRY.names())
            bad("storage_backend", f"must be one of {choices}")
        if self.ratio <= 0:
            bad("ratio", "must be positive")
        if self.size_gb < 0:
            raise ValueError(f"hicache_size must be >= 0, got {self.size_gb!r}")
        if self.storage_size_gb < 0:
            bad("storage_size_gb", "must be >= 0")
        if self.storage_chunk_size < 1:
            bad("storage_chunk_size", "must be >= 1")
        if self.storage_key is not None and len(self.storage_key) < MIN_KEY_CHARS:
            # The value itself stays out of the message (it is a secret, however weak).
            raise ValueError(f"hicache_storage_key must have at least {MIN_KEY_CHARS} characters")
        if self.storage_extra_config is not None and self.storage_backend not in EXTRA_CONFIG:
            raise ValueError(
                "hicache_storage_backend_extra_config is read by the"
                f" {', '.join(EXTRA_CONFIG)} backend, not {self.storage_backend!r}"
            )

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> HiCacheConfig | None:
        """The hierarchical cache's config (its options are checked either way); None when
        --enable-hierarchical-cache is off."""
        config = cls(
            args.hicache_ratio,
            args.hicache_size,
            args.hicache_write_policy,
            args.hicache_dtype,
            args.hicache_storage_backend,
            storage_dir(args.hicache_storage_dir),
            args.hicache_storage_size_gb,
            args.hicache_storage_chunk_size,
            args.hicache_storage_key
            or (args.hicache_storage_backend and os.environ.get(STORAGE_KEY_ENV))
            or None,
            extra_config(args.hicache_storage_backend_extra_config),
        )
        if not args.enable_hierarchical_cache:
            if args.hicache_storage_backend is not None:
                raise ValueError(
                    "hicache_storage_backend needs enable_hierarchical_cache"
                    " (--enable-hierarchical-cache)"
                )
            return None
        if args.disable_radix_cache:
            raise ValueError(
                "enable_hierarchical_cache needs the radix cache (drop --disable-radix-cache)"
            )
        return config


def extra_config(option: str | None) -> dict | None:
    """--hicache-storage-backend-extra-config: a JSON object (SGLang's), None when unset."""
    if not option:
        return None
    import json

    try:
        value = json.loads(option)
    except ValueError as e:
        raise ValueError(f"hicache_storage_backend_extra_config is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"hicache_storage_backend_extra_config must be a JSON object, got {option!r}"
        )
    return value


def storage_dir(option: str | None) -> str:
    """--hicache-storage-dir, default $RADIXLM_CACHE_DIR/hicache (~/.cache/radixlm/hicache)."""
    if option:
        return option
    root = os.environ.get("RADIXLM_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "radixlm"
    )
    return os.path.join(root, "hicache")
