"""Stored responses (store: true) for GET/DELETE /v1/responses/{id} and previous_response_id:
in memory, bounded (--max-stored-responses, least recently used out first), each kept for
--stored-response-ttl seconds after its last use, and owned by the API key that created it
(another key gets a 404, as if it did not exist)."""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable


@dataclasses.dataclass
class StoredResponse:
    owner: str  # the creating key's hash (session_api.owner)
    body: dict  # the Response object
    conversation: list[
        dict
    ]  # chat messages up to and including this response's output, without instructions
    expires: float = 0.0


class ResponseStore:
    def __init__(self, capacity: int, ttl: float, clock: Callable[[], float] = time.monotonic):
        if capacity < 0 or not ttl > 0:
            raise ValueError(
                f"max_stored_responses must be >= 0 and stored_response_ttl > 0, got {capacity} and"
                f" {ttl}"
            )
        self.capacity, self.ttl, self.clock = capacity, ttl, clock
        self._items: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def _expire(self) -> None:
        now = self.clock()
        # Oldest use first: stop at the first one still alive.
        while self._items:
            rid, item = next(iter(self._items.items()))
            if item.expires > now:
                break
            del self._items[rid]

    def put(self, rid: str, item: StoredResponse) -> None:
        if self.capacity == 0:
            return
        self._expire()
        item.expires = self.clock() + self.ttl
        self._items[rid] = item
        self._items.move_to_end(rid)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, rid: str, owner: str) -> StoredResponse | None:
        """The response if `owner` stored it and it is still kept; a use renews its time."""
        self._expire()
        item = self._items.get(rid)
        if item is None or item.owner != owner:
            return None
        item.expires = self.clock() + self.ttl
        self._items.move_to_end(rid)
        return item

    def delete(self, rid: str, owner: str) -> bool:
        if self.get(rid, owner) is None:
            return False
        del self._items[rid]
        return True
