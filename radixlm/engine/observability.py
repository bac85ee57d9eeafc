"""What watches the tokenizer manager's requests (SGLang's observability; docs/observability.md):
the request log (request_log.py), the crash dump (crash_dump.py) and the dashboard's recent
requests (recent_requests.py). The TokenizerManager holds one Observability and calls it where a
request is received, registered and finished, and when the engine dies; it outlives one engine
under --restart-on-failure (the server passes the same one to each engine's manager)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.config import ServerArgs
from radixlm.engine.crash_dump import CrashDump, check_crash_dump_folder
from radixlm.engine.recent_requests import PROMPT_HEAD_TOKENS, RecentRequests
from radixlm.engine.req_state import ReqState
from radixlm.engine.request_log import RequestLogConfig, RequestLogger
from radixlm.ipc import GenerateReqInput

logger = logging.getLogger(__name__)


def check_observability_args(args: ServerArgs) -> None:
    """A bad option is a ValueError naming it, before any process starts."""
    RequestLogConfig.from_server_args(args)
    check_crash_dump_folder(args.crash_dump_folder)


def _describe(e: BaseException) -> str:
    if isinstance(e, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled (the client went away or stopped reading)"
    return f"{type(e).__name__}: {getattr(e, 'message', None) or e}"


@dataclass
class Observability:
    """What outlives one engine under --restart-on-failure: the log's settings, the recent
    requests."""

    request_log: RequestLogger = field(default_factory=RequestLogger)
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

    # ------------------------------------------------------ request log, crash dump
    def watch(
        self, obj: GenerateReqInput, responses: AsyncIterator[Any], tokenizer
    ) -> AsyncIterator[Any]:
        """`responses` (the request's, as TokenizerManager.generate_request yields them), logged and
        recorded for the crash dump when either is on."""
        if not self.request_log.enabled and self.crash_dump is None:
            return responses
        if obj.rid is None:  # given now (as SGLang does), so that the Receive line names it
            obj.rid = (
                uuid.uuid4().hex
                if obj.is_single
                else [uuid.uuid4().hex for _ in range(obj.batch_size)]
            )
        return self._observed(obj, responses, tokenizer)

    async def _observed(
        self, obj: GenerateReqInput, gen: AsyncIterator[Any], tokenizer
    ) -> AsyncIterator[Any]:
        log, dump = self.request_log, self.crash_dump
        logged = log.received(obj, tokenizer)
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

    def engine_died(self, message: str) -> None:
        """The crash dump, written before the waiting requests fail (they are "running")."""
        dump = self.crash_dump
        if dump is None:
            return
        try:
            path = dump.dump(message)
            if path:
                logger.error("the last requests before the crash are in %s", path)
        except Exception:
            logger.exception("the crash dump could not be written")

    def configure_logging(self, **changes) -> RequestLogConfig:
        """SGLang's /configure_logging: log_requests -> enabled, log_requests_level,
        log_requests_format."""
        names = {
            "log_requests": "enabled",
            "log_requests_level": "level",
            "log_requests_format": "format",
        }
        return self.request_log.configure(
            **{names[k]: v for k, v in changes.items() if v is not None}
        )

    # ------------------------------------------------------------------- dashboard
    def registered(self, st: ReqState, input_ids: list[int], tokenizer) -> None:
        """A request sent as ids (the chat routes): its head as its prompt text, for the
        dashboard."""
        if st.prompt_text is None and self.recent.keep_text:
            st.prompt_text = tokenizer.decode(input_ids[:PROMPT_HEAD_TOKENS])

    def finished(self, st: ReqState) -> None:
        """Its last chunk applied: one record per request."""
        self.recent.add(
            st.rid,
            st.prompt_text,
            st.meta,
            st.finished_reason.to_json(),
            time.perf_counter() - st.created,
        )


def _latest(last: dict[int, Any]) -> Any:
    if -1 in last:
        return last[-1]
    if len(last) == 1 and 0 in last and "index" not in last[0]:
        return last[0]
    return [last[i] for i in sorted(last)] or None
