"""The detokenizer process: incremental, UTF-8-safe decoding and stop trimming, off the
scheduler's critical path."""

from __future__ import annotations

import dataclasses
import logging
import signal
from dataclasses import dataclass, field
from typing import Any

import zmq

from radixlm import stop_match
from radixlm.config import PortArgs
from radixlm.ipc import (
    BatchStrOut,
    BatchTokenIDOut,
    FinishAbort,
    FinishStop,
    ReqOutputChunk,
    ReqStrChunk,
)
from radixlm.sampling_params import brief_repr

logger = logging.getLogger(__name__)


@dataclass
class DecodeStatus:
    ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded text of ids[:read_offset] (complete characters only)
    surr_offset: int = 0
    read_offset: int = 0
    # The stop options come with a request's first chunk only (output_streamer.py).
    stop_tail: stop_match.StopStringTail | None = None
    stop_regex: list[str] | None = None
    # Set when a stop_regex's partial search ran out of time: text from here on is held back
    # until the request ends (one timeout per request, not one per chunk).
    regex_hold: int | None = None


class IncrementalDetokenizer:
    """Decodes growing token lists; holds back text that ends in a partial UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.states: dict[str, DecodeStatus] = {}

    def _decode(self, ids: list[int], c: ReqOutputChunk) -> str:
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=c.skip_special_tokens,
            spaces_between_special_tokens=c.spaces_between_special_tokens,
        )

    def step(self, c: ReqOutputChunk) -> str:
        """Returns the request's cumulative text after this chunk."""
        st = self.states.get(c.rid)
        if st is None:
            st = self.states[c.rid] = DecodeStatus(stop_regex=c.stop_regex)
            if c.trim_stop and c.stop_strs:
                st.stop_tail = stop_match.StopStringTail(c.stop_strs)
        st.ids.extend(c.new_output_ids)
        if c.finished_reason is not None:
            self.states.pop(c.rid, None)
            return self.final_text(st.ids, c)
        surr = self._decode(st.ids[st.surr_offset : st.read_offset], c)
        new = self._decode(st.ids[st.surr_offset :], c)
        if len(new) > len(surr) and not new.endswith("\ufffd"):
            st.text += new[len(surr) :]
            st.surr_offset, st.read_offset = st.read_offset, len(st.ids)
            if st.stop_tail is not None:
                st.stop_tail.feed(new[len(surr) :])
        if not c.trim_stop:
            return st.text
        end = len(st.text)
        if st.stop_tail is not None:
            end -= st.stop_tail.held
        if st.stop_regex:
            end = min(end, self._regex_hold(c.rid, st))
        return st.text[:end]

    @staticmethod
    def _regex_hold(rid: str, st: DecodeStatus) -> int:
        if st.regex_hold is None:
            try:
                return stop_match.hold_from(st.text, st.stop_regex)
            except stop_match.StopRegexTimeout as e:
                logger.warning(
                    "request %s: stop_regex %s timed out; holding its text back until it ends",
                    rid,
                    brief_repr(e.pattern),
                )
                st.regex_hold = stop_match.window(st.text)[0]
        return st.regex_hold

    def final_text(self, ids: list[int], c: ReqOutputChunk) -> str:
        stop = c.finished_reason if isinstance(c.finished_reason, FinishStop) else None
        matched = stop.matched if stop is not None else None
        if isinstance(matched, int) and c.trim_stop and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self._decode(ids, c)
        if isinstance(matched, str) and c.trim_stop:
            pos = _regex_stop_start(text, matched) if stop.matched_regex else text.find(matched)
            if pos >= 0:
                text = text[:pos]
        return text


def _regex_stop_start(text: str, pattern: str) -> int:
    """Where the stop_regex match the scheduler found begins: in the same window it searched."""
    start, tail = stop_match.window(text)
    try:
        hit = stop_match.first_match([pattern], tail)
    except stop_match.StopRegexTimeout:
        logger.warning(
            "stop_regex %s timed out on the final text; not trimmed", brief_repr(pattern)
        )
        return -1
    return start + hit[1].start() if hit is not None else -1


def _step_or_fail(detok: IncrementalDetokenizer, c: ReqOutputChunk) -> ReqStrChunk:
    """The request's text after chunk c; if decoding it raises, the request fails alone (an internal
    error, 500: the tokenizer manager answers it and aborts it in the scheduler), the others go on.
    """
    try:
        return ReqStrChunk(c, detok.step(c))
    except Exception as e:
        logger.exception("request %s: detokenizing failed", c.rid)
        detok.states.pop(c.rid, None)
        failed = dataclasses.replace(
            c,
            finished_reason=FinishAbort(
                f"internal error: detokenizer: {type(e).__name__}: {e}", 500
            ),
        )
        return ReqStrChunk(failed, "")


def run_detokenizer_process(
    tokenizer: str | Any, log_level: str, port_args: PortArgs, heartbeat=None
) -> None:
    """tokenizer: its path, or the launcher's loaded one (a forked child inherits it);
    heartbeat: beaten after every message and every idle second (the launcher's
    --watchdog-timeout)."""
    from radixlm.distributed.rank import beat
    from radixlm.model.loader import load_tokenizer
    from radixlm.utils import configure_logging, kill_itself_when_parent_died

    configure_logging(log_level, prefix="detokenizer")
    kill_itself_when_parent_died()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    detok = IncrementalDetokenizer(tokenizer)
    ctx = zmq.Context(2)
    recv = ctx.socket(zmq.PULL)
    recv.bind(port_args.detokenizer_ipc_name)
    send = ctx.socket(zmq.PUSH)
    send.connect(port_args.tokenizer_ipc_name)
    while True:
        beat(heartbeat)
        if not recv.poll(1000):
            continue
        msg = recv.recv_pyobj()
        if isinstance(msg, BatchTokenIDOut):
            send.send_pyobj(BatchStrOut([_step_or_fail(detok, c) for c in msg.chunks]))
        else:
            logger.error("unknown message %r", type(msg))
