"""SGLang's /start_profile body (ProfileReqInput) checked and turned into the scheduler's ProfileReq
(scheduler/control/profiler.py runs it). The same for the HTTP route and Engine.start_profile: a bad
field is a ValueError naming it; what radixlm does not do is refused, never ignored.
ProfilerControl: the start and stop control calls (the TokenizerManager's `profiler`)."""

from __future__ import annotations

import time
from typing import Any

from radixlm.engine.control_calls import ControlCalls
from radixlm.ipc import ProfileReq, ProfileReqOutput

ACTIVITIES = ("CPU", "GPU", "MEM")
# SGLang's other activities and options, each with why it is refused here.
_REFUSED_ACTIVITIES = {
    "CUDA_PROFILER": "cudaProfilerStart/Stop (for nsys) is not wired in radixlm",
    "RPD": "ROCm's rpd tracer is not supported",
    "XPU": "radixlm does not run on XPU",
}
_REFUSED_OPTIONS = {
    "profile_by_stage": (
        "one trace covers prefill and decode steps alike (use start_step / num_steps)"
    ),
    "merge_profiles": "each tp rank writes its own trace file (TP-<rank>)",
    "profile_stages": (
        "one trace covers prefill and decode steps alike (use start_step / num_steps)"
    ),
}
FIELDS = (
    "output_dir",
    "start_step",
    "num_steps",
    "activities",
    "with_stack",
    "record_shapes",
    "profile_prefix",
    *_REFUSED_OPTIONS,
)


def _int_or_none(body: dict, name: str, least: int) -> int | None:
    v = body.get(name)
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
        raise ValueError(f"{name} must be an integer >= {least} (or null), got {v!r:.60}")
    return v


def _bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise ValueError(f"{name} must be a boolean (or null), got {v!r:.60}")
    return default if v is None else v


def start_profile_request(body: Any, device: str) -> ProfileReq:
    """The start request of a /start_profile body (None or {}: SGLang's defaults); device: the
    server's (the default activities are CPU, plus GPU on CUDA, as SGLang's CPU + GPU)."""
    body = {} if body is None else body
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object (or empty)")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)} (fields: {', '.join(FIELDS)})")
    for name, why in _REFUSED_OPTIONS.items():
        if body.get(name) not in (None, False):
            raise ValueError(f"{name} is not supported: {why}")
    output_dir, prefix = body.get("output_dir"), body.get("profile_prefix")
    if output_dir is not None and not (
        isinstance(output_dir, str) and output_dir and "\0" not in output_dir
    ):
        raise ValueError("output_dir must be a directory path (or null)")
    if prefix is not None and not (isinstance(prefix, str) and not set(prefix) & {"/", "\\", "\0"}):
        raise ValueError("profile_prefix must be a string without path separators (or null)")
    activities = body.get("activities")
    if activities is None:
        activities = ["CPU", "GPU"] if device.startswith("cuda") else ["CPU"]
    if (
        not isinstance(activities, list)
        or not activities
        or not all(isinstance(a, str) for a in activities)
    ):
        raise ValueError(f"activities must be a non-empty list of {', '.join(ACTIVITIES)}")
    for a in activities:
        if a in _REFUSED_ACTIVITIES:
            raise ValueError(f"activities: {a} is not supported: {_REFUSED_ACTIVITIES[a]}")
        if a not in ACTIVITIES:
            raise ValueError(
                f"activities: unknown activity {a!r:.40} (choices: {', '.join(ACTIVITIES)})"
            )
    if "CPU" not in activities and "GPU" not in activities:
        raise ValueError(
            "activities must include CPU or GPU (MEM adds allocation events to their trace)"
        )
    return ProfileReq(
        start=True,
        output_dir=output_dir,
        start_step=_int_or_none(body, "start_step", 0),
        num_steps=_int_or_none(body, "num_steps", 1),
        activities=tuple(dict.fromkeys(activities)),
        with_stack=_bool(
            body, "with_stack", True
        ),  # SGLang's defaults (its SGLANG_PROFILE_* variables unset)
        record_shapes=_bool(body, "record_shapes", True),
        profile_prefix=prefix or "",
        profile_id=str(time.time()),  # SGLang's: the same on every rank
    )


STOP_PROFILE = ProfileReq(start=False)


class ProfilerControl:
    """The scheduler's torch profiler, started and stopped by control calls."""

    def __init__(self, control: ControlCalls, device: str):
        """device: the server's (the default activities depend on it)."""
        self.control = control
        self.device = device

    async def start(self, body: dict | None = None) -> ProfileReqOutput:
        """body: SGLang's /start_profile fields (a ValueError names a bad one)."""
        req = start_profile_request(body, self.device)
        return await self.control.call(req, ProfileReqOutput)

    async def stop(self) -> ProfileReqOutput:
        return await self.control.call(STOP_PROFILE, ProfileReqOutput)
