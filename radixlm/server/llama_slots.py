"""llama-server's slots on radixlm. radixlm has no fixed slots (requests share one KV pool and the
radix tree), so a slot here is bookkeeping of the HTTP side: --max-running-requests slots (the
requests that can run at once, as llama-server's --parallel), each remembering its last request
(its prompt's token ids, settings and counts). /completion's id_slot picks one (-1: the idle slot
whose last prompt shares the longest prefix with this one, else the least recently used, as
llama-server's prompt-similarity choice); /slots lists them; a slot's last prompt is what
/slots/{id}?action=save writes (scheduler/control/slot_files.py)."""

from __future__ import annotations

import dataclasses
import os
import time

from radixlm.server.api_common import HTTPError

MAX_FILENAME_BYTES = 255


@dataclasses.dataclass
class Slot:
    id: int
    id_task: int = -1
    is_processing: bool = False
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    cache_salt: str | None = None
    params: dict = dataclasses.field(default_factory=dict)
    n_decoded: int = 0
    has_new_line: bool = False
    used_at: float = 0.0

    def to_json(self, n_ctx: int) -> dict:
        return {
            "id": self.id,
            "id_task": self.id_task,
            "n_ctx": n_ctx,
            "speculative": False,
            "is_processing": self.is_processing,
            "params": self.params,
            "n_prompt_tokens": len(self.prompt_ids),
            "next_token": {
                "has_next_token": self.is_processing,
                "has_new_line": self.has_new_line,
                "n_remain": -1,
                "n_decoded": self.n_decoded,
            },
        }


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class SlotTable:
    def __init__(self, total: int):
        self.slots = [Slot(i) for i in range(total)]
        self._next_task = 0

    def get(self, id_slot: int, field: str = "id_slot") -> Slot:
        if not 0 <= id_slot < len(self.slots):
            raise HTTPError(
                400,
                f"{field} {id_slot} is not a slot: this server has {len(self.slots)} "
                f"(ids 0-{len(self.slots) - 1})",
                param=field,
            )
        return self.slots[id_slot]

    def acquire(self, id_slot: int, prompt_ids: list[int]) -> Slot:
        """The slot a request runs in (id_slot -1: chosen as the module docstring says). A busy
        slot named explicitly is shared: radixlm runs the request anyway and the slot shows the
        latest one."""
        if id_slot >= 0:
            slot = self.get(id_slot)
        else:
            idle = [s for s in self.slots if not s.is_processing] or self.slots
            slot = max(idle, key=lambda s: (_shared(s.prompt_ids, prompt_ids), -s.used_at))
        slot.id_task, self._next_task = self._next_task, self._next_task + 1
        slot.is_processing, slot.prompt_ids, slot.n_decoded = True, list(prompt_ids), 0
        slot.used_at = time.monotonic()
        return slot


def slot_file_path(save_dir: str | None, filename) -> str:
    """The file's path under --slot-save-path; a name that is not one plain file name (a path, ..,
    a hidden or control character) is refused, as llama-server's fs_validate_filename does."""
    if not save_dir:
        raise HTTPError(
            501,
            "this server does not save slots: start it with --slot-save-path",
            "not_supported_error",
        )
    if not isinstance(filename, str) or not filename:
        raise HTTPError(400, "filename must be a non-empty string", param="filename")
    bad = (
        len(filename.encode("utf-8", "surrogatepass")) > MAX_FILENAME_BYTES
        or filename in (".", "..")
        or filename.startswith(".")
        or any(c in filename for c in "/\\:")
        or any(ord(c) < 32 or ord(c) == 127 for c in filename)
        or os.path.basename(filename) != filename
    )
    if bad:
        raise HTTPError(
            400,
            "filename must be a plain file name (no path, no leading dot, no control characters,"
            f" at most {MAX_FILENAME_BYTES} bytes)",
            param="filename",
        )
    return os.path.join(save_dir, filename)
