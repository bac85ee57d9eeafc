"""The tokenizer manager's calls for RL loops (SGLang's names and fields, io_struct.py): update the
weights from disk, read a weight back, pause / continue generation, release / resume memory. Each
is a control call to the scheduler (scheduler/control/weight_control.py decides; docs/rl.md), as
/flush_cache is. The request builders here check every field (ValueError naming it) for the HTTP
routes and the Engine alike; what needs the model (the checkpoint's path and shape) the scheduler
checks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from radixlm.engine.control_calls import ControlCalls
from radixlm.ipc import (
    MEMORY_TAGS,
    PAUSE_MODES,
    ContinueGenerationReqInput,
    GetWeightsByNameReqInput,
    GetWeightsByNameReqOutput,
    PauseGenerationReqInput,
    ReleaseMemoryOccupationReqInput,
    ResumeMemoryOccupationReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    WeightControlReqOutput,
)


class FieldError(ValueError):
    """A bad field of an RL call (the HTTP routes name it in their 400)."""

    def __init__(self, field: str, message: str):
        super().__init__(message[:300])
        self.field = field


# The scheduler's replies to these calls (the tokenizer manager hands them to their waiters).
RL_CONTROL_REPLIES = (
    UpdateWeightFromDiskReqOutput,
    GetWeightsByNameReqOutput,
    WeightControlReqOutput,
)
# SGLang fields accepted and ignored: rid (every SGLang request has one), what only applies on CUDA.
_INERT = {"rid": None, "torch_empty_cache": bool, "recapture_cuda_graph": bool, "token_step": int}
# SGLang fields accepted only at their default: what radixlm does not do.
_ONLY_DEFAULT = {
    "is_async": (False, "an update waits for the requests in flight, SGLang's default"),
    "manifest": (None, "weights come from model_path only"),
}


def _fields(body: Any, known: tuple[str, ...], what: str) -> dict:
    """body's known fields; ValueError naming an unknown field or a non-default SGLang one."""
    body = {} if body is None else body
    if not isinstance(body, dict):
        raise FieldError("body", f"the {what} body must be a JSON object")
    unknown = sorted(
        k for k in body if k not in known and k not in _INERT and k not in _ONLY_DEFAULT
    )
    if unknown:
        raise FieldError(unknown[0], f"unknown field(s) for {what}: {', '.join(unknown)}")
    for k, kind in _INERT.items():
        if body.get(k) is not None and kind is not None and not _is(body[k], kind):
            raise FieldError(k, f"{k} must be a {kind.__name__}")
    for k, (default, why) in _ONLY_DEFAULT.items():
        if k in body and body[k] != default:
            raise FieldError(k, f"{k} is not supported ({why})")
    return {k: body[k] for k in known if k in body}


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _check(name: str, value: Any, kind: type, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not _is(value, kind):
        raise FieldError(
            name,
            f"{name} must be a {'boolean' if kind is bool else kind.__name__}"
            f"{' or null' if optional else ''}",
        )


def update_weights_request(body: Any) -> UpdateWeightFromDiskReqInput:
    f = _fields(
        body,
        (
            "model_path",
            "load_format",
            "abort_all_requests",
            "flush_cache",
            "weight_version",
            "keep_pause",
        ),
        "update_weights_from_disk",
    )
    if not isinstance(f.get("model_path"), str) or not f["model_path"]:
        raise FieldError(
            "model_path",
            "model_path must be a non-empty string: the new checkpoint's directory or .gguf file",
        )
    _check("load_format", f.get("load_format"), str, optional=True)
    _check("weight_version", f.get("weight_version"), str, optional=True)
    for k in ("abort_all_requests", "flush_cache", "keep_pause"):
        _check(k, f.get(k, False), bool)
    return UpdateWeightFromDiskReqInput(**f)


def get_weights_request(body: Any) -> GetWeightsByNameReqInput:
    f = _fields(body, ("name", "truncate_size"), "get_weights_by_name")
    if not isinstance(f.get("name"), str) or not f["name"]:
        raise FieldError(
            "name", "name must be a non-empty string: a weight's name in the checkpoint"
        )
    size = f.get("truncate_size", 100)
    if not _is(size, int) or size < 0:
        raise FieldError("truncate_size", f"truncate_size must be an integer >= 0, got {size!r}")
    return GetWeightsByNameReqInput(f["name"], size)


def pause_request(body: Any) -> PauseGenerationReqInput:
    f = _fields(body, ("mode",), "pause_generation")
    mode = f.get("mode", "abort")
    if mode not in PAUSE_MODES:
        raise FieldError("mode", f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
    return PauseGenerationReqInput(mode)


def continue_request(body: Any) -> ContinueGenerationReqInput:
    _fields(body, (), "continue_generation")
    return ContinueGenerationReqInput()


def memory_request(body: Any, cls: type, what: str):
    """A ReleaseMemoryOccupationReqInput or ResumeMemoryOccupationReqInput."""
    tags = _fields(body, ("tags",), what).get("tags")
    if tags is not None and not (
        isinstance(tags, list) and all(isinstance(t, str) and t in MEMORY_TAGS for t in tags)
    ):
        raise FieldError(
            "tags", f"tags must be a list of {', '.join(MEMORY_TAGS)} (or null: all), got {tags!r}"
        )
    return cls(tags)


class RLControl:
    """The tokenizer manager's RL calls, as control calls to the scheduler. Each raises ValueError
    with the scheduler's reason when refused."""

    def __init__(self, control: ControlCalls):
        self.control = control
        # One update at a time: replies are matched to waiters by type, in order, and the scheduler
        # holds one.
        self._weight_update_lock = asyncio.Lock()

    async def update_weights_from_disk(
        self, obj: UpdateWeightFromDiskReqInput
    ) -> UpdateWeightFromDiskReqOutput:
        async with self._weight_update_lock:
            out = await self.control.call(obj, UpdateWeightFromDiskReqOutput)
        if not out.success:
            raise ValueError(out.message)
        return out

    async def get_weights_by_name(self, obj: GetWeightsByNameReqInput) -> list:
        out = await self.control.call(obj, GetWeightsByNameReqOutput)
        if out.parameter is None:
            raise ValueError(out.message)
        return out.parameter

    async def _simple(self, obj) -> str:
        out = await self.control.call(obj, WeightControlReqOutput)
        if not out.success:
            raise ValueError(out.message)
        return out.message

    async def pause_generation(self, obj: PauseGenerationReqInput | None = None) -> str:
        return await self._simple(obj or PauseGenerationReqInput())

    async def continue_generation(self, obj: ContinueGenerationReqInput | None = None) -> str:
        return await self._simple(obj or ContinueGenerationReqInput())

    async def release_memory_occupation(
        self, obj: ReleaseMemoryOccupationReqInput | None = None
    ) -> str:
        return await self._simple(obj or ReleaseMemoryOccupationReqInput())

    async def resume_memory_occupation(
        self, obj: ResumeMemoryOccupationReqInput | None = None
    ) -> str:
        return await self._simple(obj or ResumeMemoryOccupationReqInput())
