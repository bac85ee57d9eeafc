"""SGLang's /start_profile and /stop_profile, in the scheduler process (where the model runs): a
torch profiler over the forward steps, its trace written as Chrome JSON (gzipped) to
OUTPUT_DIR/[PREFIX-]<profile id>-TP-<rank>.trace.json.gz, SGLang's file name.

start_step delays the start to that forward step (counted since the scheduler started); num_steps
stops by itself after that many steps, with no /stop_profile (SGLang's fields and semantics).
Activities: CPU (torch ops), GPU (CUDA kernels; CUDA devices only), MEM (on CPU: the profiler's
allocation events, where SGLang takes a CUDA memory snapshot)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from radixlm.ipc import ProfileReq, ProfileReqOutput
from radixlm.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)

PROFILER_DIR_ENVS = (
    "RADIXLM_TORCH_PROFILER_DIR",
    "SGLANG_TORCH_PROFILER_DIR",
)  # the first set wins
DEFAULT_PROFILER_DIR = "/tmp"  # SGLang's


def profiler_output_dir(requested: str | None) -> str:
    for value in (requested, *(os.environ.get(e) for e in PROFILER_DIR_ENVS)):
        if value:
            return os.path.expanduser(value)
    return DEFAULT_PROFILER_DIR


@dataclass
class _Session:
    req: ProfileReq
    output_dir: str
    start_at: int  # forward step to start at
    stop_at: int | None  # forward step to stop at (None: at /stop_profile)
    torch_profiler: object = None  # set once started


class Profiler:
    """At most one profiling session; after_step() runs after every scheduler step."""

    def __init__(self, stats: SchedulerStats, device: str):
        self.stats = stats
        self.device = device
        self.session: _Session | None = None

    def forward_steps(self) -> int:
        return self.stats.extend_steps + self.stats.decode_steps

    def handle(self, req: ProfileReq) -> ProfileReqOutput:
        return self.start(req) if req.start else self.stop()

    def start(self, req: ProfileReq) -> ProfileReqOutput:
        if self.session is not None:
            return ProfileReqOutput(
                False, "Profiling is already in progress. Call /stop_profile first."
            )
        if "GPU" in req.activities and not self.device.startswith("cuda"):
            return ProfileReqOutput(
                False, f"activities: GPU needs a CUDA device; this server runs on {self.device}"
            )
        out_dir = profiler_output_dir(req.output_dir)
        # now, so that a directory that cannot be written is this call's error, not a lost trace
        try:
            os.makedirs(out_dir, exist_ok=True)
            if not os.access(out_dir, os.W_OK | os.X_OK):
                raise PermissionError("not writable")
        except OSError as e:  # the path is not echoed: error bodies carry none
            which = (
                "output_dir"
                if req.output_dir
                else f"output_dir (default: ${' or $'.join(PROFILER_DIR_ENVS)})"
            )
            return ProfileReqOutput(
                False, f"{which} cannot be written: {e.strerror or 'not writable'}"
            )
        now = self.forward_steps()
        start_at = max(req.start_step, now) if req.start_step is not None else now
        stop_at = start_at + req.num_steps if req.num_steps else None
        self.session = _Session(req, out_dir, start_at, stop_at)
        if start_at == now:
            try:
                self._begin()
            except Exception:
                self.session = (
                    None  # not left "in progress": the caller gets a 500, a retry may work
                )
                raise
        how = f"for {req.num_steps} forward steps" if req.num_steps else "until /stop_profile"
        return ProfileReqOutput(
            True, f"Profiling from forward step {start_at} {how}; traces go to {out_dir}"
        )

    def stop(self) -> ProfileReqOutput:
        if self.session is None:
            return ProfileReqOutput(
                False, "Profiling is not in progress. Call /start_profile first."
            )
        return ProfileReqOutput(True, self._finish())

    def after_step(self) -> None:
        s = self.session
        if s is None:
            return
        steps = self.forward_steps()
        try:
            if s.torch_profiler is None and steps >= s.start_at:
                self._begin()
            elif s.stop_at is not None and steps >= s.stop_at:
                logger.info(self._finish())
        except Exception:
            logger.exception("profiling failed; the session ends without a trace")
            self.session = None

    def _begin(self) -> None:
        import torch

        req = self.session.req
        kinds = [torch.profiler.ProfilerActivity.CPU] if "CPU" in req.activities else []
        if "GPU" in req.activities:
            kinds.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(
            activities=kinds,
            with_stack=req.with_stack,
            record_shapes=req.record_shapes,
            profile_memory="MEM" in req.activities,
            experimental_config=_all_threads(),
        )
        prof.start()
        self.session.torch_profiler = prof
        logger.info(
            "Profiling starts. Traces will be saved to: %s (with profile id: %s)",
            self.session.output_dir,
            req.profile_id,
        )

    def _finish(self) -> str:
        """Stop, write the trace (none when the start step never came) and end the session."""
        s, self.session = self.session, None
        if s.torch_profiler is None:
            return f"Profiling stopped before forward step {s.start_at} came: no trace written"
        s.torch_profiler.stop()
        prefix = f"{s.req.profile_prefix}-" if s.req.profile_prefix else ""
        path = os.path.join(
            s.output_dir, f"{prefix}{s.req.profile_id}-TP-{_tp_rank()}.trace.json.gz"
        )
        s.torch_profiler.export_chrome_trace(path)
        return f"Profiling done. Trace saved to {path}"


def _all_threads():
    """The profiler's option to record every thread's ops: by default it records only the thread
    that started it, and under overlap scheduling the forward runs on a worker thread
    (executor.py)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (
        ImportError,
        TypeError,
    ):  # an experimental option: a torch without it traces this thread only
        return None


def _tp_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
