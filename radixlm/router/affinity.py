"""Session affinity: a session (SGLang's /open_session) lives on the one worker that opened it (its
KV is pinned in that worker's radix tree), so its turns and its close must go there, never where the
policy would send them.

The router keeps session id -> (worker, owner): the owner is a hash of the client's Authorization
header, because the workers see only the router's worker key and cannot tell clients apart. A
session used or closed with another client's key is "no open session" (400), as a worker says it.
The map is bounded (least recently used first out); a session the worker dropped (its idle timeout)
but the router still maps is the worker's own 400 on the next turn.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

MAX_SESSIONS = 65536


def client_owner(authorization: str | None) -> str:
    return hashlib.sha256((authorization or "").encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SessionHome:
    worker: str
    owner: str


class SessionAffinity:
    def __init__(self, capacity: int = MAX_SESSIONS):
        self.capacity = capacity
        self._homes: OrderedDict[str, SessionHome] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def record(self, session_id: str, worker: str, owner: str) -> None:
        self._homes[session_id] = SessionHome(worker, owner)
        self._homes.move_to_end(session_id)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def home(self, session_id: str, owner: str) -> str | None:
        """The worker of the caller's session; None when the router knows no such session of this
        caller."""
        h = self._homes.get(session_id)
        if h is None or h.owner != owner:
            return None
        self._homes.move_to_end(session_id)
        return h.worker

    def forget(self, session_id: str) -> None:
        self._homes.pop(session_id, None)

    def forget_worker(self, worker: str) -> int:
        """A removed worker's sessions are gone with it."""
        gone = [s for s, h in self._homes.items() if h.worker == worker]
        for s in gone:
            del self._homes[s]
        return len(gone)


def session_id_of(body: object) -> str | None:
    """/generate's session_params.id (None: not a session turn)."""
    if not isinstance(body, dict):
        return None
    params = body.get("session_params")
    sid = params.get("id") if isinstance(params, dict) else None
    return sid if isinstance(sid, str) and sid else None
