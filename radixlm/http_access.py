"""Who may do what over HTTP, for the server and the router alike (a leaf: no engine, no router).

- Keys: `api_key` for users, `admin_api_key` for the operator (SGLang's split). The admin key
  opens every route; admin routes (flush the cache, abort every request, add or remove router
  workers) open to it alone. With no key at all, a client of a loopback-bound process is the
  operator at this machine and is the admin; bound to a network address, nobody is.
- Browsers (CSRF, DNS rebinding): a process bound to loopback answers only Host names that are
  loopback; a browser's cross-origin request (its Origin header, or Sec-Fetch-Site without one)
  needs `allowed_origins`; JSON bodies come as application/json only, a type no page can send
  across origins without the CORS preflight that the origin check refuses.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.datastructures import Headers

from radixlm.http_common import error_json_for

# Where child processes and scripts put keys: a command line is visible to every user (`ps`),
# a process's environment only to its owner.
API_KEY_ENV = "RADIXLM_API_KEY"
ADMIN_API_KEY_ENV = "RADIXLM_ADMIN_API_KEY"

ROLE_SCOPE_KEY = "radixlm.role"  # where the middleware leaves the caller's role for the routes


class Role(enum.IntEnum):
    USER = 1
    ADMIN = 2


@dataclass(frozen=True)
class AccessConfig:
    api_key: str | None = None
    admin_api_key: str | None = None
    bind_host: str | None = (
        None  # the address the process listens on; None: unknown (no Host check)
    )
    allowed_origins: tuple[
        str, ...
    ] = ()  # browser origins allowed besides the server's own; "*": any

    @property
    def loopback(self) -> bool:
        return self.bind_host is not None and is_loopback_name(self.bind_host)


def key_from_env(value: str | None, env: str) -> str | None:
    """A flag's key, else the environment's (empty is none)."""
    return value or os.environ.get(env) or None


def parse_origins(value: str | None) -> tuple[str, ...]:
    """--allowed-origins: comma-separated origins, or vLLM's JSON list ('["*"]')."""
    if not value or not value.strip():
        return ()
    text = value.strip()
    items = json.loads(text) if text.startswith("[") else text.split(",")
    if not isinstance(items, list) or not all(isinstance(o, str) for o in items):
        raise ValueError(
            "allowed_origins must be origins separated by commas or a JSON list of strings, got"
            f" {value!r}"
        )
    return tuple(_norm_origin(o) for o in items if o.strip())


def _norm_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def is_loopback_name(host: str) -> bool:
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The name in a Host header: "h:port", "[::1]:port", "h"."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def install_access(app, cfg: AccessConfig) -> None:
    """Give an app (server or router, before it starts) its keys and browser policy; allowed
    origins also get CORS answers, so that the browser pages the operator allowed can read them."""
    app.state.access = cfg
    app.state.api_key = cfg.api_key
    if cfg.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cfg.allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
        )


def browser_refusal(cfg: AccessConfig, scope, headers: Headers) -> tuple[str, str] | None:
    """(the header, why) a (browser's) request is refused, or None."""
    host = headers.get("host")
    if cfg.loopback and host is not None and not is_loopback_name(_host_name(host)):
        return (
            "host",
            (
                f"Host {host[:100]!r} refused: a server bound to loopback answers only localhost,"
                " 127.0.0.1 and [::1] (a foreign name is how DNS rebinding reaches it)"
            ),
        )
    if "*" in cfg.allowed_origins:
        return None
    origin = headers.get("origin")
    if origin is not None:
        norm = _norm_origin(origin)
        if norm in cfg.allowed_origins or (
            host is not None and norm == f"{scope.get('scheme', 'http')}://{host.lower()}"
        ):
            return None
        return (
            "origin",
            f"cross-origin request from {origin[:100]!r} refused (allow it with --allowed-origins)",
        )
    # A browser's request without Origin from another site: <img>, <script> (a navigation, the user
    # following a link, is let through: it cannot read the answer and no GET changes anything).
    if (
        headers.get("sec-fetch-site") in ("cross-site", "same-site")
        and headers.get("sec-fetch-mode") != "navigate"
    ):
        return (
            "origin",
            "cross-site browser request refused (allow its origin with --allowed-origins)",
        )
    return None


def caller_role(cfg: AccessConfig, authorization: str) -> Role | None:
    """The caller's role, or None for a wrong or missing key where one is needed. Each configured
    key is compared in constant time, whatever the header holds."""
    got = authorization.encode()
    admin = bool(cfg.admin_api_key) and secrets.compare_digest(
        got, f"Bearer {cfg.admin_api_key}".encode()
    )
    user = bool(cfg.api_key) and secrets.compare_digest(got, f"Bearer {cfg.api_key}".encode())
    if admin:
        return Role.ADMIN
    if cfg.api_key:
        return Role.USER if user else None
    if not cfg.admin_api_key and cfg.loopback:
        return Role.ADMIN  # no key at all, loopback: the operator at this machine
    return Role.USER


def admin_refusal(cfg: AccessConfig) -> str:
    if cfg.admin_api_key:
        return "this action needs the admin API key (Authorization: Bearer <admin key>)"
    return (
        "admin actions are disabled: start with --admin-api-key (or, with no key at all, bind to"
        " loopback) to allow them"
    )


def access_of(app) -> AccessConfig:
    return getattr(app.state, "access", None) or AccessConfig(
        api_key=getattr(app.state, "api_key", None)
    )


def role_of(request) -> Role:
    return request.scope.get(ROLE_SCOPE_KEY, Role.USER)


class Refusal(Exception):
    """A request refused by a rule here; each app answers it in its error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def abort_target(body, request) -> str:
    """The rid an /abort_request body names. "" (every request) only for the admin, who asks with
    SGLang's abort_all or an empty rid; from anyone else an empty rid is a 400 and abort_all a 403.
    """
    if not isinstance(body, dict):
        raise Refusal(400, "the request body must be a JSON object with a field rid", "rid")
    rid, abort_all = body.get("rid"), body.get("abort_all", False)
    if not isinstance(abort_all, bool):
        raise Refusal(400, "abort_all must be a boolean", "abort_all")
    if abort_all or rid == "":
        if role_of(request) >= Role.ADMIN:
            return ""
        if abort_all:
            raise Refusal(
                403,
                f"abort_all: {admin_refusal(access_of(request.app))}",
                "abort_all",
                "permission_error",
            )
        raise Refusal(
            400, "rid must name a request: an empty rid (every request) is an admin action", "rid"
        )
    if not isinstance(rid, str):
        raise Refusal(400, "abort_request needs a string field rid", "rid")
    return rid


def json_content_type_error(content_type: str | None) -> str | None:
    """Why a JSON body's Content-Type is refused, or None. Only JSON types: the form and text
    types (and none) are what a web page may send to another origin without asking first."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype == "application/json" or ctype.endswith("+json"):
        return None
    got = f"Content-Type {ctype[:100]!r}" if ctype else "a missing Content-Type"
    return f"unsupported {got}: the body must be JSON sent as Content-Type: application/json"


def presented_key(headers: Headers) -> str:
    """The Authorization header, else Anthropic's x-api-key as its Bearer equivalent (the
    anthropic client sends only that one)."""
    key = headers.get("x-api-key")
    return headers.get("authorization") or (f"Bearer {key}" if key else "")


class AccessMiddleware:
    """Every request: the browser checks (403), the key (401, every route but /health), admin
    routes (403); the caller's role is left in the scope for routes whose admin part depends on
    the body (/abort_request). A plain ASGI middleware: FastAPI's @app.middleware("http") passes
    each streamed chunk through an extra task and memory stream, which costs a streaming request
    CPU on every token. Reads app.state.access (install_access), else app.state.api_key alone."""

    OPEN_PATHS = ("/health",)

    def __init__(self, app, admin_paths: Iterable[str] = (), open_paths: Iterable[str] = ()):
        """open_paths: more routes without a key (the dashboard's pages: they hold no data)."""
        self.app = app
        self.admin_paths = frozenset(admin_paths)
        self.open_paths = frozenset((*self.OPEN_PATHS, *open_paths))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS":  # OPTIONS: CORS preflights
            await self.app(scope, receive, send)
            return
        cfg = access_of(scope["app"])
        headers = Headers(scope=scope)
        response = None
        refused = browser_refusal(cfg, scope, headers)
        if refused:
            response = error_json_for(
                scope["path"], 403, refused[1], "permission_error", refused[0]
            )
        elif scope["path"] not in self.open_paths:
            role = caller_role(cfg, presented_key(headers))
            if role is None:
                response = error_json_for(
                    scope["path"],
                    401,
                    "invalid or missing API key (Authorization: Bearer <key>, or x-api-key: <key>)",
                    "authentication_error",
                )
            elif scope["path"] in self.admin_paths and role < Role.ADMIN:
                response = error_json_for(
                    scope["path"], 403, admin_refusal(cfg), "permission_error"
                )
            else:
                scope[ROLE_SCOPE_KEY] = role
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
