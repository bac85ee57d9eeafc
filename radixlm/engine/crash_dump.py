"""--crash-dump-folder (SGLang's): the requests of the last 5 minutes, finished or still running,
written to FOLDER/<hostname>/crash_dump_<date>.json when the engine dies (its scheduler or
detokenizer exits or hangs: the watchdog's verdict, before the waiting requests fail), once per
engine.

SGLang pickles its request objects; this is JSON (readable anywhere; loading it runs no code), one
entry per request: the request as received ("obj", GenerateReqInput's fields), the last output
("out"; the text so far for a request still running), times, and "finished". The file holds prompts
and outputs, so it is created 0600 in a 0700 directory; it holds no key: server_args' secrets and
their values on the launch command line are ***, a cache_salt is ***."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from radixlm.config import ServerArgs
from radixlm.engine.request_log import UNLIMITED, loggable

WINDOW_SECONDS = 300.0  # SGLang's: finished requests are kept this long after they finished
MAX_FINISHED = 10_000  # and at most this many (a bound on memory under heavy load)
# ServerArgs' secrets: its fields kept out of repr (the keys).
SECRETS = tuple(f.name for f in dataclasses.fields(ServerArgs) if not f.repr)


@dataclass
class RequestRecord:
    """References, made JSON (secrets masked) only when a dump is written."""

    obj: Any  # the GenerateReqInput as received
    created_time: float = field(default_factory=time.time)
    finished_time: float | None = None
    out: Any = None  # the last output (a dict, or a list for a batch)
    error: str | None = None

    def as_json(self) -> dict:
        return {
            "rid": loggable(getattr(self.obj, "rid", None), UNLIMITED),
            "finished": self.finished_time is not None,
            "obj": loggable(self.obj, UNLIMITED),
            "out": loggable(self.out, UNLIMITED),
            "error": self.error,
            "created_time": self.created_time,
            "finished_time": self.finished_time,
        }


def check_crash_dump_folder(folder: str | None) -> None:
    """At start-up: a folder that cannot be written is an error now, not a dump lost at the
    crash."""
    if not folder:
        return
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as e:
        raise ValueError(
            f"crash_dump_folder {folder!r} cannot be written: {e.strerror or e}"
        ) from None


def masked_argv(argv: list[str]) -> list[str]:
    """The command line with the values of the key flags replaced by ***."""
    flags = {"--" + name.replace("_", "-") for name in SECRETS}
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("***")
        elif "=" in a and a.split("=", 1)[0] in flags:
            out.append(a.split("=", 1)[0] + "=***")
        else:
            out.append(a)
        hide = a in flags
    return out


class CrashDump:
    def __init__(self, folder: str, server_args: ServerArgs):
        self.folder = folder
        self.server_args = server_args
        self.running: dict[int, RequestRecord] = {}  # by id(record)
        self.finished: deque[RequestRecord] = deque(maxlen=MAX_FINISHED)

    def received(self, obj) -> RequestRecord:
        rec = RequestRecord(obj)
        self.running[id(rec)] = rec
        return rec

    def progress(self, rec: RequestRecord, out: Any) -> None:
        rec.out = out

    def finished_request(
        self, rec: RequestRecord, out: Any = None, error: str | None = None
    ) -> None:
        self.running.pop(id(rec), None)
        rec.finished_time = time.time()
        rec.out = out if out is not None else rec.out
        rec.error = error
        self.finished.append(rec)
        while self.finished and rec.finished_time - self.finished[0].finished_time > WINDOW_SECONDS:
            self.finished.popleft()

    def dump(self, reason: str) -> str | None:
        """Write the dump; its path, or None when there was no request to dump (as SGLang)."""
        now = time.time()
        records = [r for r in self.finished if now - r.finished_time <= WINDOW_SECONDS]
        records += sorted(self.running.values(), key=lambda r: r.created_time)
        if not records:
            return None
        args = dataclasses.asdict(self.server_args)
        for name in SECRETS:
            if args.get(name):
                args[name] = "***"
        host = os.environ.get("HOSTNAME") or socket.gethostname()
        data = {
            "reason": reason,
            "time": datetime.now().isoformat(),
            "hostname": host,
            "server_args": args,
            "launch_command": " ".join(masked_argv(sys.argv)),
            "requests": [r.as_json() for r in records],
        }
        directory = os.path.join(self.folder, host.replace(os.sep, "_"))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        for n in range(1000):  # two engines of one server dying within a second get two files
            path = os.path.join(directory, f"crash_dump_{stamp}{f'_{n}' if n else ''}.json")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free crash dump name in {directory}")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, ensure_ascii=False)
        return path
