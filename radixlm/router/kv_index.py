"""What each worker's KV cache holds, as its KV events say (SGLang's --kv-events-config stream;
the subscriber that feeds this is kv_events.py): per worker the live block hashes of its device
pool (medium GPU), built from BlockStored / BlockRemoved / AllBlocksCleared alone.

A block hash names a whole prefix (SGLang's chained hashes, kv_block_hash.py), so a request's
cached prefix on a worker is the run of its own chain that the worker holds, from the start. A
hybrid model's worker also publishes its state snapshots (medium GPU_STATE: cache/kv_events.py);
its prefix is reusable only up to the deepest snapshot on that run, as its match_prefix is.

A worker's view is *synced* while it is known to be complete: from its publisher's first batch
(seq 0), after a replay that filled a gap, and after any AllBlocksCleared (nothing held before it
matters). A batch that skips sequence numbers the replay cannot supply leaves the view incomplete
(unsynced: the policy falls back to its text tree for that worker) until the next
AllBlocksCleared. A publisher that starts again (a worker restarted: its seq back at or below what
was seen, with a later timestamp) means an empty cache: the view is cleared. A batch at or below
the last seq with an older timestamp is a replayed duplicate and skipped. A worker the health
checks found down is *suspect*: unsynced until its next batch tells whether it restarted (the view
cleared) or not (the view resumes).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from radixlm.kv_block_hash import block_hashes

MEDIUM = "GPU"  # the tier a match reuses without a copy (SGLang's name for the KV pool)
STATE_MEDIUM = "GPU_STATE"  # a hybrid's device state snapshots


@dataclass
class WorkerView:
    blocks: set[int] = field(default_factory=set)
    states: set[int] = field(default_factory=set)  # blocks a device state snapshot ends
    hybrid: bool = False  # it published a snapshot: matches end at snapshots
    synced: bool = True  # complete as far as the events tell (see the module docstring)
    suspect: bool = False  # found down: unsynced until its next batch
    seq: int = -1  # the last batch applied
    ts: float = 0.0  # its timestamp
    batches: int = 0
    gaps: int = 0  # batches skipped that no replay supplied
    restarts: int = 0  # publishers seen starting again

    def as_dict(self) -> dict:
        return {
            "synced": self.synced,
            "blocks": len(self.blocks),
            "state_snapshots": len(self.states) if self.hybrid else None,
            "seq": self.seq,
            "batches": self.batches,
            "gaps": self.gaps,
            "restarts": self.restarts,
        }


class KvEventIndex:
    def __init__(self) -> None:
        self.views: dict[str, WorkerView] = {}
        self._lock = threading.Lock()

    def view(self, worker: str) -> WorkerView:
        with self._lock:
            return self.views.setdefault(worker, WorkerView())

    def synced(self, worker: str) -> bool:
        v = self.views.get(worker)
        return v is not None and v.synced

    def suspect(self, worker: str) -> None:
        """The worker was found down: it may come back restarted, its cache empty, before it
        publishes anything."""
        with self._lock:
            v = self.views.get(worker)
            if v is not None and v.synced:
                v.synced, v.suspect = False, True

    def drop(self, worker: str) -> None:
        """A worker removed or found dead: its cache is unknown until its events say more."""
        with self._lock:
            self.views.pop(worker, None)

    # -- the stream --------------------------------------------------------------------------
    def position(self, worker: str, seq: int, ts: float) -> str:
        """Where a batch stands in the worker's stream: "next", "duplicate", "restart" (its
        publisher started again) or "gap" (batches before it are missing)."""
        v = self.view(worker)
        if seq <= v.seq:
            return "restart" if ts > v.ts else "duplicate"
        return "next" if seq == v.seq + 1 else "gap"

    def restart(self, worker: str) -> None:
        with self._lock:
            v = self.views.setdefault(worker, WorkerView())
            v.blocks.clear()
            v.states.clear()
            v.synced, v.suspect, v.seq, v.restarts = True, False, -1, v.restarts + 1

    def lost(self, worker: str, seq: int) -> None:
        """Batches before seq are gone for good: the view is incomplete from here."""
        with self._lock:
            v = self.views.setdefault(worker, WorkerView())
            v.synced, v.suspect, v.seq, v.gaps = False, False, seq - 1, v.gaps + 1

    def apply(self, worker: str, seq: int, batch) -> None:
        """One KVEventBatch (kv_event_schema.py), in order."""
        with self._lock:
            v = self.views.setdefault(worker, WorkerView())
            if v.suspect:  # the batch after its last one: the same publisher, not restarted
                v.synced, v.suspect = True, False
            for e in batch.events:
                kind = type(e).__name__
                if kind == "AllBlocksCleared":
                    v.blocks.clear()
                    v.states.clear()
                    v.synced = True
                    continue
                if e.medium == STATE_MEDIUM:
                    held, v.hybrid = v.states, True
                elif e.medium in (MEDIUM, None):
                    held = v.blocks
                else:
                    continue  # host copies: a match there costs a load, not counted here
                if kind == "BlockStored":
                    held.update(e.block_hashes)
                elif kind == "BlockRemoved":
                    held.difference_update(e.block_hashes)
            v.seq, v.ts, v.batches = seq, batch.ts, v.batches + 1

    # -- routing -----------------------------------------------------------------------------
    def matched_tokens(self, token_ids: list[int], workers: list[str]) -> dict[str, int]:
        """For each synced worker among `workers`: how many leading tokens of token_ids its cache
        holds (the others are left out: their views are incomplete)."""
        chain = block_hashes(token_ids)
        out = {}
        with self._lock:
            for w in workers:
                v = self.views.get(w)
                if v is None or not v.synced:
                    continue
                n = 0
                while n < len(chain) and chain[n] in v.blocks:
                    n += 1
                while v.hybrid and n and chain[n - 1] not in v.states:
                    n -= 1  # a hybrid resumes at its deepest snapshot within the run
                out[w] = n
        return out

    def stats(self) -> dict[str, dict]:
        with self._lock:
            return {w: v.as_dict() for w, v in self.views.items()}
