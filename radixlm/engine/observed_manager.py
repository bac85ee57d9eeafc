"""The TokenizerManager with SGLang's observability: the request log (request_log.py), the crash
dump (crash_dump.py) and the profiler's control calls (profiling.py; scheduler/control/profiler.py
runs them). A subclass, so that tokenizer_manager.py (at the module size limit) stays one concept:
requests in,
outputs back. The server and the Engine build this one."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.config import PortArgs, ServerArgs
from radixlm.engine.crash_dump import CrashDump, check_crash_dump_folder
from radixlm.engine.embedding import EmbeddingMixin
from radixlm.engine.profiling import STOP_PROFILE, start_profile_request
from radixlm.engine.recent_requests import PROMPT_HEAD_TOKENS, RecentRequests
from radixlm.engine.request_log import RequestLogConfig, RequestLogger
from radixlm.engine.tokenizer_manager import TokenizerManager, TokenizerManagerConfig
from radixlm.ipc import (
    DashboardSnapshotReq,
    DashboardSnapshotReqOutput,
    GenerateReqInput,
    ProfileReqOutput,
    ReqStrChunk,
    TokenizedGenerateReqInput,
)

logger = logging.getLogger(__name__)


@dataclass
class Observability:
    """What outlives one engine under --restart-on-failure: the log's settings, the recent
    requests."""

    request_log: RequestLogger
    crash_dump: CrashDump | None = None
    device: str = "cpu"  # the profiler's default activities depend on it
    recent: RecentRequests = field(default_factory=RecentRequests)  # /dashboard's recent requests

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> Observability:
        dump = CrashDump(args.crash_dump_folder, args) if args.crash_dump_folder else None
        return cls(
            RequestLogger(RequestLogConfig.from_server_args(args)),
            dump,
            args.device,
            RecentRequests(keep_text=args.dashboard_show_text),
        )


def check_observability_args(args: ServerArgs) -> None:
    """A bad option is a ValueError naming it, before any process starts."""
    RequestLogConfig.from_server_args(args)
    check_crash_dump_folder(args.crash_dump_folder)


def _describe(e: BaseException) -> str:
    if isinstance(e, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled (the client went away or stopped reading)"
    return f"{type(e).__name__}: {getattr(e, 'message', None) or e}"


class ObservedTokenizerManager(
    EmbeddingMixin, TokenizerManager
):  # EmbeddingMixin: encode (embedding.py)
    def __init__(
        self,
        config: TokenizerManagerConfig,
        port_args: PortArgs,
        tokenizer,
        scheduler_info: dict,
        observability: Observability | None = None,
    ):
        super().__init__(config, port_args, tokenizer, scheduler_info)
        self.observability = observability or Observability(RequestLogger())

    # ------------------------------------------------------ request log, crash dump
    def generate_request(
        self, obj: GenerateReqInput, admit: Callable[[int], None] | None = None
    ) -> AsyncIterator[Any]:
        obs = self.observability
        if not obs.request_log.enabled and obs.crash_dump is None:
            return super().generate_request(obj, admit)
        if obj.rid is None:  # given now (as SGLang does), so that the Receive line names it
            obj.rid = (
                uuid.uuid4().hex
                if obj.is_single
                else [uuid.uuid4().hex for _ in range(obj.batch_size)]
            )
        return self._observed(obj, super().generate_request(obj, admit))

    async def _observed(self, obj: GenerateReqInput, gen: AsyncIterator[Any]) -> AsyncIterator[Any]:
        log, dump = self.observability.request_log, self.observability.crash_dump
        logged = log.received(obj, self.tokenizer)
        rec = dump.received(obj) if dump is not None else None
        last: dict[int, Any] = {}  # the latest output of each sequence (a batch's list: under -1)
        error: str | None = None
        try:
            async for out in gen:
                last[-1 if isinstance(out, list) else out.get("index", 0)] = out
                if rec is not None:
                    dump.progress(rec, _latest(last))
                yield out
        except BaseException as e:
            error = _describe(e)
            raise
        finally:
            await gen.aclose()  # its own finally aborts what still runs
            final = _latest(last)
            if error is None:
                log.finished(logged, final)
            else:
                log.failed(logged, error)
            if rec is not None:
                dump.finished_request(rec, final, error)

    def mark_dead(self, message: str) -> None:
        dump = self.observability.crash_dump
        if (
            dump is not None and self.dead_message is None
        ):  # before the waiting requests fail: they are "running"
            try:
                path = dump.dump(message)
                if path:
                    logger.error("the last requests before the crash are in %s", path)
            except Exception:
                logger.exception("the crash dump could not be written")
        super().mark_dead(message)

    def configure_logging(self, **changes) -> RequestLogConfig:
        """SGLang's /configure_logging: log_requests -> enabled, log_requests_level,
        log_requests_format."""
        names = {
            "log_requests": "enabled",
            "log_requests_level": "level",
            "log_requests_format": "format",
        }
        return self.observability.request_log.configure(
            **{names[k]: v for k, v in changes.items() if v is not None}
        )

    # ------------------------------------------------------------------- dashboard
    def _register(self, r: TokenizedGenerateReqInput, text_in_logprobs: bool):
        st = super()._register(r, text_in_logprobs)
        if (
            st.prompt_text is None and self.observability.recent.keep_text
        ):  # ids (the chat routes): their head
            st.prompt_text = self.tokenizer.decode(r.input_ids[:PROMPT_HEAD_TOKENS])
        return st

    def _on_chunk(self, sc: ReqStrChunk) -> None:
        st = self.rid_to_state.get(sc.chunk.rid)
        running = st is not None and st.finished_reason is None
        super()._on_chunk(sc)
        if running and st.finished_reason is not None:  # its last chunk: one record per request
            self.observability.recent.add(
                st.rid,
                st.prompt_text,
                st.meta,
                st.finished_reason.to_json(),
                time.perf_counter() - st.created,
            )

    async def dashboard_snapshot(
        self, max_nodes: int, with_token_ids: bool
    ) -> DashboardSnapshotReqOutput:
        """The scheduler's internal state and its tree's largest shared prefixes (one control
        call)."""
        return await self._control(
            DashboardSnapshotReq(max_nodes, with_token_ids), DashboardSnapshotReqOutput
        )

    # -------------------------------------------------------------------- profiler
    async def start_profile(self, body: dict | None = None) -> ProfileReqOutput:
        """body: SGLang's /start_profile fields (a ValueError names a bad one)."""
        req = start_profile_request(body, self.observability.device)
        return await self._control(req, ProfileReqOutput)

    async def stop_profile(self) -> ProfileReqOutput:
        return await self._control(STOP_PROFILE, ProfileReqOutput)


def _latest(last: dict[int, Any]) -> Any:
    if -1 in last:
        return last[-1]
    if len(last) == 1 and 0 in last and "index" not in last[0]:
        return last[0]
    return [last[i] for i in sorted(last)] or None
