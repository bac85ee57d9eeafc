"""ReqQueues: every request the scheduler holds, in the one container its status names.

A request's ReqStatus (req.py) is the single source of truth for where it is: `move` sets the
status and puts the request in that status's container, taking it out of the old one, and
nothing else changes a status or a container. NEW and FINISHED requests are in no container.
The invariant checks assert status <=> container after every step (check()).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from radixlm.scheduler.req import Req, ReqStatus

S = ReqStatus
_UNHELD = (S.NEW, S.FINISHED)


class ReqQueues:
    def __init__(self) -> None:
        self._by_status: dict[ReqStatus, list[Req]] = {s: [] for s in ReqStatus if s not in _UNHELD}

    # --- the containers (lists: their order is the scheduling order) --------------
    @property
    def waiting(self) -> list[Req]:
        """Queued for admission, in the policy's order (the policy sorts this list in place)."""
        return self._by_status[S.WAITING]

    @property
    def running(self) -> list[Req]:
        """Decoding, in batch order."""
        return self._by_status[S.RUNNING]

    @property
    def prefilling(self) -> list[Req]:
        """Admitted, prefill under way. Between steps at most one: the request between its
        chunks."""
        return self._by_status[S.PREFILLING]

    @property
    def grammar_pending(self) -> list[Req]:
        return self._by_status[S.GRAMMAR_PENDING]

    @property
    def prefetching(self) -> list[Req]:
        return self._by_status[S.PREFETCHING]

    @property
    def finishing(self) -> list[Req]:
        """Finished; their KV is released when the step in flight that still reads it completes."""
        return self._by_status[S.FINISHING]

    @property
    def kv_bootstrap(self) -> list[Req]:
        """PD decode: waiting for the prefill server's route and for KV room (nothing held)."""
        return self._by_status[S.KV_BOOTSTRAP]

    @property
    def kv_transfer(self) -> list[Req]:
        """PD: holding KV slots while a transfer runs (decode: arriving; prefill: being sent)."""
        return self._by_status[S.KV_TRANSFER]

    # --- moves ----------------------------------------------------------------------
    def move(self, req: Req, status: ReqStatus, front: bool = False) -> None:
        """req goes to `status` (and its container: at the front with front=True)."""
        self._take_out(req)
        req.status = status
        if status not in _UNHELD:
            container = self._by_status[status]
            if front:
                container.insert(0, req)
            else:
                container.append(req)

    def move_all(self, reqs: list[Req], status: ReqStatus, front: bool = False) -> None:
        """Several requests, keeping their order; one pass over each container they leave."""
        leaving: dict[ReqStatus, set[int]] = {}
        for r in reqs:
            if r.status not in _UNHELD:
                leaving.setdefault(r.status, set()).add(id(r))
        for old, ids in leaving.items():
            self._by_status[old][:] = [r for r in self._by_status[old] if id(r) not in ids]
        for r in reqs:
            r.status = status
        if status not in _UNHELD:
            container = self._by_status[status]
            if front:
                container[0:0] = reqs
            else:
                container.extend(reqs)

    def _take_out(self, req: Req) -> None:
        if req.status not in _UNHELD:
            container = self._by_status[req.status]
            for i, r in enumerate(container):
                if r is req:
                    del container[i]
                    return

    # --- views ------------------------------------------------------------------------
    def of(self, *statuses: ReqStatus) -> list[Req]:
        return [r for s in statuses for r in self._by_status[s]]

    def __iter__(self) -> Iterator[Req]:
        for container in self._by_status.values():
            yield from container

    def is_idle(self) -> bool:
        return not any(self._by_status.values())

    def has_work(self) -> bool:
        """Something a step can run now (no need to wait for new messages)."""
        return bool(self.waiting or self.running or self.prefilling or self.finishing)

    def holders(self) -> list[Req]:
        """Requests that hold KV: prefilling, running, or finishing behind the step in flight."""
        return self.of(S.PREFILLING, S.RUNNING, S.FINISHING, S.KV_TRANSFER)

    def idle_reqs(self) -> list[Req]:
        """Requests that must hold nothing."""
        return self.of(S.GRAMMAR_PENDING, S.PREFETCHING, S.WAITING, S.KV_BOOTSTRAP)

    def find(self, rid: str) -> Req | None:
        return next((r for r in self if r.rid == rid), None)

    def matching(self, rid: str, statuses: Iterable[ReqStatus]) -> list[Req]:
        """The requests of those statuses with this rid ("": all of them)."""
        return [r for r in self.of(*statuses) if rid in ("", r.rid)]

    def check(self) -> str | None:
        """What breaks status <=> container (each held request in exactly the container of its
        status, once), or None."""
        seen: set[int] = set()
        for status, container in self._by_status.items():
            for r in container:
                if r.status is not status:
                    return (
                        f"request {r.rid} has status {r.status.value} but sits in the"
                        f" {status.value} queue"
                    )
                if id(r) in seen:
                    return f"request {r.rid} is held twice"
                seen.add(id(r))
        if len(self.prefilling) > 1:
            return f"{len(self.prefilling)} requests between prefill chunks (at most one)"
        return None
