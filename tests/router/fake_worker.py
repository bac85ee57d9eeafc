"""A stand-in HTTP server for router tests: answers each path as told and records every request
(method, path, headers, body), so a test sees what the router sent where, with which key."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = tuple[int, object]  # (status, JSON body; a str is sent as text)
Route = Answer | Callable[["Seen"], Answer]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict
    body: bytes

    @property
    def auth(self):
        return self.headers.get("authorization")


MODEL_INFO = {"model_path": "fake-model", "is_generation": True}
GENERATED = {
    "text": "from the fake",
    "output_ids": [1],
    "meta_info": {"finish_reason": {"type": "length"}},
}


def radixlm_like(key: str | None = None, admin_key: str | None = None) -> dict[str, Route]:
    """Routes of a radixlm server with these keys (401 in its error shape without one)."""

    def keyed(answer: Answer, admin: bool = False) -> Route:
        def route(seen: Seen) -> Answer:
            allowed = {f"Bearer {k}" for k in ((admin_key,) if admin else (key, admin_key)) if k}
            if allowed and seen.auth not in allowed:
                return 401, {
                    "error": {
                        "message": "invalid or missing API key",
                        "type": "authentication_error",
                    }
                }
            return answer

        return route

    return {
        "/health": (200, ""),
        "/get_model_info": keyed((200, MODEL_INFO)),
        "/generate": keyed((200, GENERATED)),
        "/abort_request": keyed((200, "")),
        "/flush_cache": keyed((200, "Cache flushed."), admin=True),
    }


class FakeWorker:
    def __init__(self, routes: dict[str, Route], delays: dict[str, float] | None = None):
        self.routes, self.delays, self.seen = routes, delays or {}, []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                n = int(self.headers.get("content-length") or 0)
                seen = Seen(
                    self.command,
                    self.path.split("?")[0],
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(n) if n else b"",
                )
                owner.seen.append(seen)
                time.sleep(owner.delays.get(seen.path, 0))
                route = owner.routes.get(seen.path, (404, {"detail": "Not Found"}))
                status, body = route(seen) if callable(route) else route
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header(
                        "Content-Type",
                        "text/plain" if isinstance(body, str) else "application/json",
                    )
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the router gave up waiting
                    pass

            do_GET = do_POST = _serve

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False  # a stalled answer (delays) must not hold stop() up
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requests_to(self, path: str) -> list[Seen]:
        return [s for s in list(self.seen) if s.path == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
