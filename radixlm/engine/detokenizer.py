"""The detokenizer process: incremental, UTF-8-safe decoding and stop trimming, off the
scheduler's critical path."""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
from dataclasses import dataclass, field

import regex
import zmq

from radixlm.config import PortArgs
from radixlm.ipc import BatchStrOut, BatchTokenIDOut, FinishAbort, FinishStop, ReqOutputChunk, ReqStrChunk

logger = logging.getLogger(__name__)


@dataclass
class DecodeStatus:
    ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded text of ids[:read_offset] (complete characters only)
    surr_offset: int = 0
    read_offset: int = 0


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
        st = self.states.setdefault(c.rid, DecodeStatus())
        st.ids.extend(c.new_output_ids)
        if c.finished_reason is not None:
            self.states.pop(c.rid, None)
            return self.final_text(st.ids, c)
        surr = self._decode(st.ids[st.surr_offset : st.read_offset], c)
        new = self._decode(st.ids[st.surr_offset :], c)
        if len(new) > len(surr) and not new.endswith("\ufffd"):
            st.text += new[len(surr) :]
            st.surr_offset, st.read_offset = st.read_offset, len(st.ids)
        if not c.trim_stop:
            return st.text
        end = len(st.text)
        if c.stop_strs:
            end -= _stop_prefix_len(st.text, c.stop_strs)
        if c.stop_regex:
            end = min(end, _regex_hold_from(st.text, c.stop_regex))
        return st.text[:end]

    def final_text(self, ids: list[int], c: ReqOutputChunk) -> str:
        stop = c.finished_reason if isinstance(c.finished_reason, FinishStop) else None
        matched = stop.matched if stop is not None else None
        if isinstance(matched, int) and c.trim_stop and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self._decode(ids, c)
        if isinstance(matched, str) and c.trim_stop:
            if stop.matched_regex:
                m = re.search(matched, text)
                pos = m.start() if m else -1
            else:
                pos = text.find(matched)
            if pos >= 0:
                text = text[:pos]
        return text


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string: that
    text may yet become the stop string, which the final text trims."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def _regex_hold_from(text: str, patterns: list[str]) -> int:
    """Where the text a stop_regex may still match (given more output) begins: the earliest
    partial match that reaches the end (the `regex` module's partial matching)."""
    hold = len(text)
    for p in patterns:
        try:
            m = regex.search(p, text, partial=True)
        except regex.error:  # a pattern only `re` accepts: nothing held back, the final text is trimmed
            continue
        if m is not None and (m.partial or m.end() == len(text)):
            hold = min(hold, m.start())
    return hold


def _step_or_fail(detok: IncrementalDetokenizer, c: ReqOutputChunk) -> ReqStrChunk:
    """The request's text after chunk c; if decoding it raises, the request fails alone (an internal
    error, 500: the tokenizer manager answers it and aborts it in the scheduler), the others go on."""
    try:
        return ReqStrChunk(c, detok.step(c))
    except Exception as e:  # noqa: BLE001
        logger.exception("request %s: detokenizing failed", c.rid)
        detok.states.pop(c.rid, None)
        failed = dataclasses.replace(c, finished_reason=FinishAbort(f"internal error: detokenizer: {type(e).__name__}: "
                                                                    f"{e}", 500))
        return ReqStrChunk(failed, "")


def run_detokenizer_process(tokenizer_path: str, log_level: str, port_args: PortArgs, heartbeat=None) -> None:
    """heartbeat: beaten after every message and every idle second (the launcher's --watchdog-timeout)."""
    from radixlm.distributed.rank import beat
    from radixlm.model.loader import load_tokenizer
    from radixlm.utils import configure_logging, kill_itself_when_parent_died

    configure_logging(log_level, prefix="detokenizer")
    kill_itself_when_parent_died()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tokenizer = load_tokenizer(tokenizer_path)
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
