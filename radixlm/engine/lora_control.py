"""The tokenizer manager's side of LoRA serving: adapter names -> ids, and loading / unloading live.

Requests name an adapter (/generate `lora_path`, the OpenAI routes' `BASE:ADAPTER`); the scheduler
gets the adapter's id (its name and a digest of its files), which is also its prefix-cache
namespace (a name reloaded with other weights shares no KV with the old ones). Unloading an adapter
that requests use waits for them (SGLang does the same): the name is gone at once (new requests get
a 400 / 404), the scheduler drops the weights when the last request under it has finished.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from radixlm.engine.control_calls import ControlCalls
from radixlm.engine.req_state import ReqState
from radixlm.ipc import LoadLoRAAdapterReqInput, LoRAUpdateReqOutput, UnloadLoRAAdapterReqInput
from radixlm.sampling_params import brief_repr

_WAIT_POLL_S = 0.02


def cache_namespace(salt: str | None) -> str | None:
    """The prefix cache's namespace of requests with this cache_salt (vLLM's field): a hash, so the
    salt itself is kept nowhere (the tree, the L3 chunk keys). None: the common namespace.
    lora_namespace puts a request's adapter in front of it."""
    if salt is None:
        return None
    return "salt:" + hashlib.sha256(salt.encode()).hexdigest()[:32]


class LoRAError(ValueError):
    """A refused adapter call: the HTTP status and the field it names."""

    def __init__(self, message: str, status_code: int = 400, field: str = "lora_name"):
        super().__init__(message)
        self.status_code, self.field = status_code, field


@dataclass(frozen=True)
class ServedAdapter:
    lora_name: str
    lora_path: str
    pinned: bool
    uid: str


def lora_namespace(uid: str | None, salt_namespace: str | None) -> str | None:
    """The prefix-cache namespace of a request under adapter `uid` (and maybe a cache_salt)."""
    if uid is None:
        return salt_namespace
    return f"lora:{uid}" + (f"|{salt_namespace}" if salt_namespace else "")


class LoRAControl:
    """The adapters served: names -> ids for requests, and loading / unloading live (control calls
    to the scheduler)."""

    def __init__(
        self, control: ControlCalls, scheduler_info: Mapping, requests: Mapping[str, ReqState]
    ):
        """scheduler_info: the scheduler's (lora_enabled, the adapters loaded at start:
        --lora-paths); requests: the tokenizer manager's requests in flight (an unload waits for
        those under the adapter)."""
        self.control = control
        self.enabled = bool(scheduler_info.get("lora_enabled"))
        self._by_name: dict[str, ServedAdapter] = {
            a["lora_name"]: ServedAdapter(**a) for a in scheduler_info.get("lora_adapters", ())
        }
        self._requests = requests

    def adapter_names(self) -> list[str]:
        return list(self._by_name)

    def served_adapters(self) -> list[ServedAdapter]:
        return list(self._by_name.values())

    def resolve(self, name: Any, field: str = "lora_path") -> str | None:
        """The id of adapter `name` (None: the base model); ValueError naming the field
        otherwise."""
        if name is None:
            return None
        if not self.enabled:
            raise ValueError(
                f"{field}: this server serves no LoRA adapters (start it with --enable-lora)"
            )
        adapter = self._by_name.get(name) if isinstance(name, str) else None
        if adapter is None:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise ValueError(
                f"{field}: the LoRA adapter {brief_repr(name)} is not loaded (loaded: {known})"
            )
        return adapter.uid

    async def load_lora_adapter(
        self, lora_name: Any, lora_path: Any, pinned: Any = False
    ) -> ServedAdapter:
        if not self.enabled:
            raise LoRAError("LoRA is off: start the server with --enable-lora", 400)
        from radixlm.lora.config import check_name

        try:
            check_name(lora_name)
        except ValueError as e:
            raise LoRAError(str(e)) from None
        if not isinstance(lora_path, str) or not lora_path:
            raise LoRAError(
                "lora_path must be a non-empty string: the adapter's peft directory",
                field="lora_path",
            )
        if not isinstance(pinned, bool):
            raise LoRAError("pinned must be a boolean", field="pinned")
        if lora_name in self._by_name:
            raise LoRAError(
                f"a LoRA adapter named {lora_name!r} is already loaded (unload it first)", 409
            )
        out = await self.control.call(
            LoadLoRAAdapterReqInput(lora_name, lora_path, pinned), LoRAUpdateReqOutput
        )
        if not out.success:
            raise LoRAError(out.message, 400, "lora_path")
        if lora_name in self._by_name:  # two loads of one name raced: the first one stays
            await self.control.call(
                UnloadLoRAAdapterReqInput(out.adapter["uid"]), LoRAUpdateReqOutput
            )
            raise LoRAError(
                f"a LoRA adapter named {lora_name!r} is already loaded (unload it first)", 409
            )
        adapter = ServedAdapter(**out.adapter)
        self._by_name[lora_name] = adapter
        return adapter

    async def unload_lora_adapter(self, lora_name: Any) -> None:
        adapter = self._by_name.pop(lora_name, None) if isinstance(lora_name, str) else None
        if adapter is None:
            raise LoRAError(f"no LoRA adapter named {brief_repr(lora_name)} is loaded", 404)
        while any(st.lora_id == adapter.uid for st in self._requests.values()):
            await asyncio.sleep(_WAIT_POLL_S)  # requests under it finish first
        out = await self.control.call(UnloadLoRAAdapterReqInput(adapter.uid), LoRAUpdateReqOutput)
        if not out.success:
            raise RuntimeError(out.message)
