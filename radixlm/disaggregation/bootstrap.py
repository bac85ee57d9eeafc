"""The bootstrap service of a prefill server (SGLang's): an HTTP endpoint on
--disaggregation-bootstrap-port where each prefill rank registers its control endpoint (PUT
/route) and where a decode server looks it up (GET /route?engine_rank=N) before it tells the prefill
where to write a request's KV. Registration carries the transfer backend and the KV layout, so a
decode server with another model or backend is refused before anything moves."""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

logger = logging.getLogger(__name__)


class BootstrapServer:
    """Runs on a daemon thread of the prefill rank 0 process; ranks register over HTTP like
    SGLang's (a rank of another process would PUT the same route)."""

    def __init__(self, host: str, port: int):
        self.routes: dict[int, dict] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet: the server's own log says what matters
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urlparse(self.path)
                if url.path == "/health":
                    return self._reply(200, {"status": "ok"})
                if url.path != "/route":
                    return self._reply(404, {"error": "unknown route"})
                rank = parse_qs(url.query).get("engine_rank", ["0"])[0]
                with outer.lock:
                    route = outer.routes.get(int(rank)) if rank.isdigit() else None
                if route is None:
                    return self._reply(404, {"error": f"engine_rank {rank} has not registered"})
                return self._reply(200, route)

            def do_PUT(self):
                if urlparse(self.path).path != "/route":
                    return self._reply(404, {"error": "unknown route"})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    rank = int(body["engine_rank"])
                except (ValueError, KeyError, TypeError) as e:
                    return self._reply(400, {"error": f"bad registration: {e}"})
                with outer.lock:
                    outer.routes[rank] = body
                return self._reply(200, {"registered": rank})

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="radixlm-pd-bootstrap", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def register(url: str, route: dict, timeout: float = 5.0) -> None:
    req = urllib.request.Request(
        url + "/route",
        data=json.dumps(route).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()


def query_route(host: str, port: int, engine_rank: int = 0, timeout: float = 5.0) -> dict | None:
    """The registered route, or None while the rank has not registered; raises OSError when the
    service cannot be reached."""
    host = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(
            f"http://{host}:{port}/route?engine_rank={engine_rank}", timeout=timeout
        ) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
