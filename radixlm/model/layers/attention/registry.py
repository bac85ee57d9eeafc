"""Attention backends by name (SGLang's attention_registry): --attention-backend, and
--prefill-attention-backend / --decode-attention-backend for a HybridAttnBackend.

A new backend is its own module (the AttentionBackend subclass and a `supported(spec)`) plus one
`@register_attention_backend` entry below (ATTENTION_BACKEND_REGISTRY: the factory by name, its
`supported` and `auto_devices` as metadata). Entries are in auto's order of preference: with no name
given, the first backend that supports the model runs it, among those whose `auto_devices` include
the model's device (triton is auto's choice on CUDA only: on CPU its kernels run in Triton's
interpreter, for tests, when asked for by name).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from radixlm.model.layers.attention.base import AttentionBackend, AttentionBackendSpec
from radixlm.model.layers.attention.hybrid import HybridAttnBackend
from radixlm.model.layers.attention.mla_backend import MLABackend
from radixlm.model.layers.attention.mla_backend import supported as mla_supported
from radixlm.model.layers.attention.native import NativeCPUBackend
from radixlm.model.layers.attention.native import supported as native_supported
from radixlm.model.layers.attention.torch_sdpa import TorchSDPABackend
from radixlm.model.layers.attention.torch_sdpa import supported as torch_sdpa_supported
from radixlm.model.layers.attention.triton_backend import TritonAttnBackend
from radixlm.model.layers.attention.triton_backend import supported as triton_supported
from radixlm.registry import Registry

BackendFactory = Callable[[AttentionBackendSpec], AttentionBackend]


@dataclass(frozen=True)
class AttentionBackendInfo:
    """A backend's metadata: whether it runs a model, and where auto may pick it."""

    supported: Callable[
        [AttentionBackendSpec], str | None
    ]  # None, or why the backend cannot run spec
    auto_devices: tuple[str, ...] | None = None  # device types auto picks it on (None: any)

    def auto_reason(self, spec: AttentionBackendSpec) -> str | None:
        """supported's answer, or why auto passes the backend by on this device."""
        if self.auto_devices is not None and spec.device.type not in self.auto_devices:
            return f"auto picks it on {' or '.join(self.auto_devices)} only"
        return self.supported(spec)


ATTENTION_BACKEND_REGISTRY = Registry[BackendFactory, AttentionBackendInfo]("attention backend")


def _refusing_mla(supported: Callable[[AttentionBackendSpec], str | None]):
    """A backend of per-head K/V cannot read the latent pool of an MLA model (spec.mla)."""
    return lambda spec: (
        "reads per-head K/V; an MLA model's pool holds latents (use mla)"
        if spec.mla
        else supported(spec)
    )


def register_attention_backend(
    name: str,
    supported: Callable[[AttentionBackendSpec], str | None],
    mla: bool = False,
    auto_devices: tuple[str, ...] | None = None,
) -> Callable[[BackendFactory], BackendFactory]:
    """mla: the backend reads the latent pool of multi-head latent attention models (else it is
    refused for them without asking `supported`). auto_devices: the device types auto may pick it
    on.
    """
    info = AttentionBackendInfo(supported if mla else _refusing_mla(supported), auto_devices)
    return ATTENTION_BACKEND_REGISTRY.register(name, meta=info)


@register_attention_backend("native", supported=native_supported)
def create_native_backend(spec: AttentionBackendSpec) -> AttentionBackend:
    return NativeCPUBackend()


# Auto's choice on CUDA: paged extend and split-KV decode by slot, no gather (triton_backend.py).
@register_attention_backend("triton", supported=triton_supported, auto_devices=("cuda",))
def create_triton_backend(spec: AttentionBackendSpec) -> AttentionBackend:
    return TritonAttnBackend(spec)


@register_attention_backend("torch", supported=torch_sdpa_supported)
def create_torch_sdpa_backend(spec: AttentionBackendSpec) -> AttentionBackend:
    return TorchSDPABackend.for_spec(spec)


# Last: it serves only the models the others refuse (spec.mla), so auto's order is unchanged.
@register_attention_backend("mla", supported=mla_supported, mla=True)
def create_mla_backend(spec: AttentionBackendSpec) -> AttentionBackend:
    return MLABackend()


ATTENTION_BACKENDS: tuple[str, ...] = ATTENTION_BACKEND_REGISTRY.names()


def check_attention_backend_name(name: str | None, field: str = "attention_backend") -> None:
    """A ValueError naming the option for a name no entry has (None: auto)."""
    if name is not None and name not in ATTENTION_BACKEND_REGISTRY:
        choices = ", ".join(ATTENTION_BACKEND_REGISTRY.names())
        raise ValueError(f"{field} must be one of {choices}, got {name!r}")


def resolve_attention_backend(
    name: str | None, spec: AttentionBackendSpec, field: str = "attention_backend"
) -> str:
    """The backend that runs spec: `name`, or (None) the first entry that supports spec. A
    ValueError, naming `field`, when that backend cannot."""
    check_attention_backend_name(name, field)
    if name is not None:
        why = ATTENTION_BACKEND_REGISTRY.meta(name).supported(spec)
        if why is not None:
            raise ValueError(f"{field} {name}: {why}")
        return name
    reasons = []
    for candidate in ATTENTION_BACKEND_REGISTRY:
        why = ATTENTION_BACKEND_REGISTRY.meta(candidate).auto_reason(spec)
        if why is None:
            return candidate
        reasons.append(f"{candidate}: {why}")
    raise ValueError(f"{field}: no attention backend runs this model ({'; '.join(reasons)})")


def resolve_attention_backends(
    spec: AttentionBackendSpec,
    attention_backend: str | None = None,
    prefill_attention_backend: str | None = None,
    decode_attention_backend: str | None = None,
) -> tuple[str, str]:
    """(prefill, decode) backend names; a role's own name (None) falls back to attention_backend,
    which (None) is auto."""
    # Every name first: a bad one is reported before any backend is probed.
    check_attention_backend_name(attention_backend)
    check_attention_backend_name(prefill_attention_backend, "prefill_attention_backend")
    check_attention_backend_name(decode_attention_backend, "decode_attention_backend")

    def resolve(own: str | None, field: str) -> str:
        if own is None:
            return resolve_attention_backend(attention_backend, spec)
        return resolve_attention_backend(own, spec, field)

    return (
        resolve(prefill_attention_backend, "prefill_attention_backend"),
        resolve(decode_attention_backend, "decode_attention_backend"),
    )


def create_attention_backend(
    name: str | None,
    spec: AttentionBackendSpec,
    *,
    prefill: str | None = None,
    decode: str | None = None,
) -> AttentionBackend:
    """The backend of --attention-backend `name` (None: auto) for spec; with --prefill- /
    --decode-attention-backend naming different backends, a HybridAttnBackend of the two."""
    prefill_name, decode_name = resolve_attention_backends(spec, name, prefill, decode)
    if prefill_name == decode_name:
        return ATTENTION_BACKEND_REGISTRY.get(prefill_name)(spec)
    return HybridAttnBackend(
        ATTENTION_BACKEND_REGISTRY.get(prefill_name)(spec),
        ATTENTION_BACKEND_REGISTRY.get(decode_name)(spec),
    )
