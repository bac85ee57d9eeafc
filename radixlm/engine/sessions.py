"""Sessions (SGLang's /open_session, /close_session and `session_params` on /generate): an agent's
turns append to one session, whose KV the scheduler keeps pinned in the radix tree until the
session is closed or times out (scheduler/kv/session_pins.py), so a long agent loop never prefills
its history again after an eviction.

This side keeps each session's turns (the token ids each one ends with), builds a turn's prompt
from them (`session_params`: id, rid, offset, replace, drop_previous_output, as SGLang reads them),
binds the request to the session in the scheduler (ipc.BindSessionReq, sent on the request's own
socket, so it arrives first), bounds the number of open sessions (in all, and per API key), and
closes sessions that stay idle past their timeout (ipc.CloseSessionReq). A session runs one turn
at a time: a turn continues a finished one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from radixlm.config import ServerArgs
from radixlm.engine.tokenizer_manager import TokenizerManager
from radixlm.ipc import BindSessionReq, CloseSessionReq, GenerateReqInput
from radixlm.sampling_params import brief_repr

SESSION_PARAMS = ("id", "rid", "offset", "replace", "drop_previous_output")
MAX_SESSION_ID_CHARS = 256


class SessionError(ValueError):
    """A refused session call: an HTTP status and the field it is about."""

    def __init__(self, status: int, message: str, param: str):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass(frozen=True)
class SessionConfig:
    timeout: float = (
        300.0  # --session-timeout: the longest a session may stay idle (a request may ask less)
    )
    max_sessions: int = 64  # --max-sessions: open sessions in all (0: sessions off)
    max_sessions_per_key: int = 16  # --max-sessions-per-key: open sessions of one API key

    def __post_init__(self):
        if not self.timeout > 0:
            raise ValueError(f"session_timeout must be > 0, got {self.timeout}")
        if self.max_sessions < 0 or self.max_sessions_per_key < 1:
            raise ValueError(
                "max_sessions must be >= 0 and max_sessions_per_key >= 1, got "
                f"{self.max_sessions} and {self.max_sessions_per_key}"
            )

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> SessionConfig:
        return cls(args.session_timeout, args.max_sessions, args.max_sessions_per_key)


@dataclass
class Turn:
    rid: str
    ids: list[int]  # its prompt and output: what the next turn continues
    prompt_len: int  # drop_previous_output continues after the prompt
    parent: str | None  # the turn it continued (replace drops a turn's descendants)


@dataclass
class Session:
    id: str
    owner: str
    timeout: float
    capacity: int  # the most tokens a turn's prompt may have
    turns: dict[str, Turn] = field(default_factory=dict)  # in order: the last one is the latest
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False


@dataclass
class TurnPlan:
    """A validated turn, ready to run: the request (its prompt is the history plus the new ids)."""

    session: Session
    obj: GenerateReqInput
    rid: str
    parent: str | None


class SessionManager:
    def __init__(self, tm: TokenizerManager, config: SessionConfig):
        self.tm = tm
        self.config = config
        self.sessions: dict[str, Session] = {}
        self._sweeper: asyncio.Task | None = None

    # ------------------------------------------------------------ open, close
    def open(self, owner: str, body: dict) -> str:
        unknown = sorted(set(body) - {"capacity_of_str_len", "session_id", "timeout", "streaming"})
        if unknown:
            raise SessionError(400, f"unknown field(s): {', '.join(unknown)}", unknown[0])
        if body.get("streaming"):
            raise SessionError(400, "streaming sessions are not supported", "streaming")
        cap = body.get("capacity_of_str_len")
        if cap is None:
            cap = self.tm.context_len
        if not _is_int(cap) or cap < 1:
            raise SessionError(
                400,
                "capacity_of_str_len must be a positive integer (the most tokens a turn's "
                f"prompt may have), got {brief_repr(cap)}",
                "capacity_of_str_len",
            )
        timeout = body.get("timeout")
        if timeout is not None and not (
            isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout
        ):
            raise SessionError(
                400,
                f"timeout must be a number of seconds > 0, got {brief_repr(timeout)}",
                "timeout",
            )
        sid = body.get("session_id")
        if sid is not None and not (isinstance(sid, str) and 0 < len(sid) <= MAX_SESSION_ID_CHARS):
            raise SessionError(
                400,
                f"session_id must be a non-empty string of at most {MAX_SESSION_ID_CHARS} "
                f"characters, got {brief_repr(sid)}",
                "session_id",
            )
        self.expire()
        if sid in self.sessions:
            raise SessionError(400, f"session_id {sid!r} is already open", "session_id")
        if len(self.sessions) >= self.config.max_sessions:
            raise SessionError(
                429,
                f"too many open sessions ({self.config.max_sessions}, --max-sessions): close "
                "one or wait for one to time out",
                "session_id",
            )
        mine = sum(s.owner == owner for s in self.sessions.values())
        if mine >= self.config.max_sessions_per_key:
            raise SessionError(
                429,
                f"this API key has {mine} open sessions, the most it may have "
                "(--max-sessions-per-key): close one or wait for one to time out",
                "session_id",
            )
        sid = sid or uuid.uuid4().hex
        # The server's timeout bounds the session's: a client cannot pin KV for longer.
        # (min before float: a JSON integer may be too large for a float.)
        self.sessions[sid] = Session(
            sid, owner, float(min(timeout or self.config.timeout, self.config.timeout)), cap
        )
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return sid

    def close(self, owner: str, session_id: Any) -> None:
        self._find(owner, session_id, "session_id")
        self._drop(session_id)

    def _find(self, owner: str, sid: Any, param: str) -> Session:
        s = self.sessions.get(sid) if isinstance(sid, str) else None
        if (
            s is None or s.owner != owner or self._expired(s)
        ):  # another key's session is not named to this one
            raise SessionError(400, f"{param}: no open session {brief_repr(sid)}", param)
        return s

    def _drop(self, sid: str) -> None:
        if self.sessions.pop(sid, None) is not None and self.tm.dead_message is None:
            self.tm.send_to_scheduler.send_pyobj(CloseSessionReq(sid))

    # ---------------------------------------------------------------- timeout
    def _expired(self, s: Session) -> bool:
        return not s.busy and time.monotonic() - s.last_used > s.timeout

    def expire(self) -> None:
        for s in [s for s in self.sessions.values() if self._expired(s)]:
            self._drop(s.id)

    async def _sweep(self) -> None:
        """Closes idle sessions within a second of their timeout; ends with the last session."""
        while self.sessions:
            await asyncio.sleep(min(1.0, min(s.timeout for s in self.sessions.values()) / 4))
            self.expire()

    # ------------------------------------------------------------------ turns
    async def prepare(self, owner: str, obj: GenerateReqInput, params: Any) -> TurnPlan:
        """A /generate with session_params: its prompt becomes the session's history plus its
        own."""
        if not isinstance(params, dict):
            raise SessionError(400, "session_params must be an object", "session_params")
        unknown = sorted(set(params) - set(SESSION_PARAMS))
        if unknown:
            raise SessionError(
                400,
                f"session_params has unknown field(s): {', '.join(unknown)}",
                f"session_params.{unknown[0]}",
            )
        s = self._find(owner, params.get("id"), "session_params.id")
        sp = obj.sampling_params
        if not obj.is_single or (isinstance(sp, dict) and sp.get("n") not in (None, 1)):
            raise SessionError(400, "a session's turn is one prompt with n = 1", "session_params")
        for flag in ("replace", "drop_previous_output"):
            if params.get(flag) is not None and not isinstance(params.get(flag), bool):
                raise SessionError(
                    400, f"session_params.{flag} must be a boolean", f"session_params.{flag}"
                )
        if s.busy:
            raise SessionError(
                409,
                f"session {s.id!r} is running a turn: send the next one when it is done",
                "session_params.id",
            )
        parent = params.get("rid")
        if parent is not None and parent not in s.turns:
            raise SessionError(
                400,
                f"session_params.rid: session {s.id!r} has no finished turn {brief_repr(parent)}",
                "session_params.rid",
            )
        if parent is None and not params.get("replace") and s.turns:
            parent = next(reversed(s.turns))  # no rid: continue the latest turn
        base: list[int] = []
        if parent is not None:
            t = s.turns[parent]
            base = t.ids[: t.prompt_len] if params.get("drop_previous_output") else t.ids
        offset = params.get("offset")
        if offset is not None:
            if not _is_int(offset) or not 0 <= offset <= len(base):
                raise SessionError(
                    400,
                    f"session_params.offset must be an integer in [0, {len(base)}] (the "
                    f"continued turn's tokens), got {brief_repr(offset)}",
                    "session_params.offset",
                )
            base = base[:offset] if offset else base  # SGLang: 0 means no cut
        if obj.image_data not in (
            None,
            [],
            "",
        ):  # a turn's history is ids: it cannot place images (yet)
            raise SessionError(400, "image_data is not supported in session turns", "image_data")
        try:
            new = (
                obj.input_ids
                if obj.input_ids is not None
                else await self.tm.tokenizer_pool.run(self.tm.encode_prompt, obj.text)
            )
        except ValueError as e:  # a text longer than the context
            raise SessionError(400, str(e), "text") from None
        bos = getattr(self.tm.tokenizer, "bos_token_id", None)
        if base and new and new[0] == bos:
            new = new[1:]  # the history already begins with it
        ids = base + list(new)
        if len(ids) > s.capacity:
            raise SessionError(
                400,
                f"the turn's prompt would have {len(ids)} tokens, more than the session's "
                f"capacity_of_str_len {s.capacity}",
                "session_params.id",
            )
        rid = obj.rid or uuid.uuid4().hex
        if not isinstance(rid, str) or rid in s.turns:
            raise SessionError(
                400, f"rid {brief_repr(rid)} is already a turn of this session", "rid"
            )
        if params.get(
            "replace"
        ):  # the new turn takes the place of the continued turn's descendants
            self._drop_descendants(s, parent)
        return TurnPlan(s, dataclasses.replace(obj, text=None, input_ids=ids, rid=rid), rid, parent)

    @staticmethod
    def _drop_descendants(s: Session, rid: str | None) -> None:
        gone = {rid} if rid is not None else set()
        for t in list(s.turns.values()):  # in order: a parent comes before its children
            if (rid is None and t.rid not in gone) or t.parent in gone:
                gone.add(t.rid)
        for r in gone - ({rid} if rid is not None else set()):
            s.turns.pop(r, None)

    async def run(
        self, plan: TurnPlan, admit: Callable[[int], None] | None = None
    ) -> AsyncIterator[Any]:
        """The turn's responses (as TokenizerManager.generate_request's); a turn that finishes (not
        aborted) becomes one the next can continue."""
        s = plan.session
        if s.busy or s.id not in self.sessions:
            raise SessionError(
                409, f"session {s.id!r} is running a turn or was closed", "session_params.id"
            )
        s.busy = True
        try:
            self.tm.send_to_scheduler.send_pyobj(BindSessionReq(plan.rid, s.id))
            async for out in self.tm.generate_request(plan.obj, admit=admit):
                fr = out["meta_info"].get("finish_reason")
                if fr is not None and fr.get("type") != "abort":
                    ids = plan.obj.input_ids
                    s.turns[plan.rid] = Turn(
                        plan.rid, ids + list(out["output_ids"]), len(ids), plan.parent
                    )
                yield out
        finally:
            s.busy = False
            s.last_used = time.monotonic()

    def info(self) -> dict:
        return {"open_sessions": len(self.sessions)}


_MANAGERS: weakref.WeakKeyDictionary[TokenizerManager, SessionManager] = weakref.WeakKeyDictionary()


def session_manager(tm: TokenizerManager, args: ServerArgs) -> SessionManager:
    """The sessions of this engine (a restarted engine starts with none: its tree is new)."""
    m = _MANAGERS.get(tm)
    if m is None:
        m = _MANAGERS[tm] = SessionManager(tm, SessionConfig.from_server_args(args))
    return m


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
