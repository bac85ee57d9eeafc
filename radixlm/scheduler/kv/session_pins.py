"""SessionPins: the KV of open sessions stays in the radix tree (SGLang's /open_session).

A session (engine/sessions.py keeps its turns) pins its latest turn: when a request bound to a
session finishes, its committed KV goes into the tree as any request's does, and the session takes
a lock on the node where it ends, the way a running request locks its prefix; the previous turn's
lock is dropped after the new one is taken (the shared path never looks evictable). So eviction
under memory pressure never takes a session's history, and the next turn re-prefills only its new
tokens. Closing the session (or its timeout, decided by the tokenizer manager) drops the lock: the
KV becomes evictable like any cached prefix. The invariant checker counts these locks as holders
(`nodes`), so every node's lock_ref still equals what holds it.

Without a prefix cache nothing can be pinned: NoSessionPins forgets the bindings. BaseSessionPins
is what the scheduler, the Finisher and the invariant checker ask of either.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from radixlm.cache.tree_node import TreeNode
from radixlm.ipc import BindSessionReq, CloseSessionReq
from radixlm.scheduler.kv.cache_manager import CacheManager
from radixlm.scheduler.req import Req

logger = logging.getLogger(__name__)

# The most of the KV pool that sessions may pin together (their paths counted whole, shared parts
# twice: an upper bound). Past it a turn's KV is cached unpinned, like any request's: pins must not
# leave other traffic without room to run until the sessions time out.
MAX_PINNED_FRACTION = 0.5

SessionMsg = BindSessionReq | CloseSessionReq
SESSION_MESSAGES = (BindSessionReq, CloseSessionReq)


class BaseSessionPins(ABC):
    @abstractmethod
    def handle(self, msg: SessionMsg) -> None:
        """A session's binding of its next turn, or its close."""

    @abstractmethod
    def before_release(self, req: Req) -> None:
        """req finished and is about to give up its KV (Finisher)."""

    @abstractmethod
    def unpin_all(self) -> None:
        """Before /flush_cache drops the tree."""

    @abstractmethod
    def nodes(self) -> list[TreeNode]:
        """The pinned nodes (one lock each), for the invariant checker."""

    @abstractmethod
    def info(self) -> dict:
        """For /get_server_info's internal_state."""


class SessionPins(BaseSessionPins):
    def __init__(self, cache_manager: CacheManager):
        self.cm = cache_manager
        self.pins: dict[str, TreeNode] = {}  # session id -> the locked node ending its latest turn
        self.pinned_len: dict[str, int] = {}  # session id -> tokens on its pinned path
        self.max_pinned = int(cache_manager.token_to_kv_pool.size * MAX_PINNED_FRACTION)
        self.refused = 0  # turns left unpinned because of max_pinned
        # rid -> session id of turns not yet finished. At most one per session (the tokenizer
        # manager runs one turn of a session at a time; a new binding replaces an older one whose
        # request never arrived, e.g. refused by validation), so this is bounded by the sessions.
        self.turns: dict[str, str] = {}

    def handle(self, msg: SessionMsg) -> None:
        if isinstance(msg, BindSessionReq):
            self._forget_turns(msg.session_id)
            self.turns[msg.rid] = msg.session_id
        else:
            self.close(msg.session_id)

    def before_release(self, req: Req) -> None:
        """req finished and is about to give up its KV (Finisher): a session's turn first hands its
        committed KV to the tree and moves the session's pin onto it."""
        sid = self.turns.pop(req.rid, None)
        if sid is None or not req.holds_kv():
            return
        # Inserts [0, committed) and moves req's lock to the node ending exactly there.
        self.cm.cache_req(req, finished=False)
        node = req.last_node
        if node is None or node is self.cm.tree_cache.root_node:
            return  # nothing computed (aborted before its prefill)
        others = sum(self.pinned_len.values()) - self.pinned_len.get(sid, 0)
        if others + req.cache_protected_len > self.max_pinned:
            if not self.refused:
                logger.warning(
                    "sessions would pin more than %d KV tokens: turn %s of session %s stays"
                    " unpinned",
                    self.max_pinned,
                    req.rid,
                    sid,
                )
            self.refused += 1
            return  # its older pin, if any, stays: a prefix of this turn, still worth keeping
        self.cm.lock(node)
        old = self.pins.get(sid)
        self.pins[sid], self.pinned_len[sid] = node, req.cache_protected_len
        if old is not None:
            self.cm.unlock(old)

    def close(self, session_id: str) -> None:
        self._forget_turns(session_id)
        node = self.pins.pop(session_id, None)
        self.pinned_len.pop(session_id, None)
        if node is not None:
            self.cm.unlock(node)

    def unpin_all(self) -> None:
        """Before /flush_cache drops the tree: the sessions go on, their next turns prefill
        again."""
        for node in self.pins.values():
            self.cm.unlock(node)
        self.pins.clear()
        self.pinned_len.clear()

    def nodes(self) -> list[TreeNode]:
        return list(self.pins.values())

    def info(self) -> dict:
        return {
            "pinned_sessions": len(self.pins),
            "session_pinned_tokens": sum(self.pinned_len.values()),
            "session_pins_refused": self.refused,
        }

    def _forget_turns(self, session_id: str) -> None:
        for rid in [r for r, s in self.turns.items() if s == session_id]:
            del self.turns[rid]


class NoSessionPins(BaseSessionPins):
    """--disable-radix-cache: a session's turns still carry its history, nothing is pinned."""

    def handle(self, msg: SessionMsg) -> None:
        pass

    def before_release(self, req: Req) -> None:
        pass

    def unpin_all(self) -> None:
        pass

    def nodes(self) -> list[TreeNode]:
        return []

    def info(self) -> dict:
        return {"pinned_sessions": 0, "session_pinned_tokens": 0, "session_pins_refused": 0}


def create_session_pins(cache_manager: CacheManager) -> BaseSessionPins:
    """SessionPins where the cache shares prefixes (a radix tree), else NoSessionPins."""
    if cache_manager.tree_cache.capabilities().shares_prefixes:
        return SessionPins(cache_manager)
    return NoSessionPins()
