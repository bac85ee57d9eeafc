"""The access rules of radixlm/http_access.py on a bare app, for every key setup: who is admin
(no key at all: only on loopback), which Host and Origin headers pass."""

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from radixlm.http_access import AccessConfig, AccessMiddleware, install_access, parse_origins


def app_with(cfg: AccessConfig) -> FastAPI:
    app = FastAPI()
    app.get("/x")(lambda: {"ok": True})
    app.post("/admin")(lambda: {"ok": True})
    app.add_middleware(AccessMiddleware, admin_paths=("/admin",))
    install_access(app, cfg)
    return app


def call(app, method, path, headers=None, host="127.0.0.1:30000"):
    async def go():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=f"http://{host}"
        ) as c:
            return await c.request(method, path, headers=headers or {})

    return asyncio.run(go()).status_code


@pytest.mark.parametrize(
    "cfg, auth, user, admin",
    [
        # no key at all: on loopback everyone is the operator; on a network address nobody is admin
        (AccessConfig(bind_host="127.0.0.1"), None, 200, 200),
        (AccessConfig(bind_host="0.0.0.0"), None, 200, 403),
        (AccessConfig(bind_host="10.0.0.5"), None, 200, 403),
        # a user key only: admin actions disabled for everyone
        (AccessConfig("u", bind_host="127.0.0.1"), "u", 200, 403),
        (AccessConfig("u", bind_host="127.0.0.1"), None, 401, 401),
        # both keys: the admin key opens everything, the user key the user routes
        (AccessConfig("u", "a", bind_host="127.0.0.1"), "u", 200, 403),
        (AccessConfig("u", "a", bind_host="127.0.0.1"), "a", 200, 200),
        (AccessConfig("u", "a", bind_host="127.0.0.1"), "x", 401, 401),
        # an admin key only: user routes open (as SGLang), admin routes need it, on loopback too
        (AccessConfig(admin_api_key="a", bind_host="127.0.0.1"), None, 200, 403),
        (AccessConfig(admin_api_key="a", bind_host="0.0.0.0"), "a", 200, 200),
        # an empty key is no key
        (AccessConfig("", "", bind_host="0.0.0.0"), "", 200, 403),
    ],
)
def test_roles(cfg, auth, user, admin):
    app = app_with(cfg)
    headers = {"Authorization": f"Bearer {auth}"} if auth is not None else {}
    assert call(app, "GET", "/x", headers) == user
    assert call(app, "POST", "/admin", headers) == admin


def test_host_and_origin():
    app = app_with(
        AccessConfig(bind_host="127.0.0.1", allowed_origins=parse_origins("https://app.example/"))
    )
    for host in ("localhost:1", "127.0.0.1", "127.1.2.3:1", "[::1]:1", "LOCALHOST"):
        assert call(app, "GET", "/x", host=host) == 200, host
    for host in ("evil.example:1", "localhost.evil.example", "127.0.0.1.nip.io", "0.0.0.0:1"):
        assert call(app, "GET", "/x", host=host) == 403, host
    assert call(app, "POST", "/admin", {"Origin": "https://app.example"}) == 200
    assert call(app, "POST", "/admin", {"Origin": "http://127.0.0.1:30000"}) == 200  # its own page
    for origin in (
        "https://evil.example",
        "null",
        "http://localhost:30000",
        "https://app.example.evil",
    ):
        assert call(app, "POST", "/admin", {"Origin": origin}) == 403, origin
    # Bound to a network address: any Host (names unknown here); Origin still checked.
    wide = app_with(AccessConfig(bind_host="0.0.0.0"))
    assert call(wide, "GET", "/x", host="llm.example") == 200
    assert call(wide, "GET", "/x", {"Origin": "https://evil.example"}, host="llm.example") == 403
    anyone = app_with(AccessConfig(bind_host="127.0.0.1", allowed_origins=parse_origins('["*"]')))
    assert call(anyone, "GET", "/x", {"Origin": "https://evil.example"}) == 200


def test_parse_origins():
    assert parse_origins(None) == parse_origins("") == ()
    assert parse_origins("https://A.example/, http://b:8080") == (
        "https://a.example",
        "http://b:8080",
    )
    assert parse_origins('["*"]') == ("*",)
    with pytest.raises(ValueError, match="allowed_origins"):
        parse_origins("[1, 2]")


def test_x_api_key_and_anthropic_shaped_refusals():
    """Anthropic's clients send the key as x-api-key; refusals on /v1/messages are in its error
    shape."""
    app = app_with(AccessConfig("u", "a", bind_host="127.0.0.1"))
    app.post("/v1/messages")(lambda: {"ok": True})
    assert call(app, "GET", "/x", {"x-api-key": "u"}) == 200
    assert call(app, "POST", "/admin", {"x-api-key": "u"}) == 403
    assert call(app, "POST", "/admin", {"x-api-key": "a"}) == 200
    assert call(app, "GET", "/x", {"x-api-key": "wrong"}) == 401

    async def go(path, key):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as c:
            return await c.post(path, headers={"x-api-key": key})

    r = asyncio.run(go("/v1/messages", "wrong"))
    assert r.status_code == 401 and r.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": r.json()["error"]["message"]},
    }
    assert asyncio.run(go("/v1/messages", "u")).json() == {"ok": True}
    assert (
        asyncio.run(go("/admin", "wrong")).json()["error"]["code"] == 401
    )  # OpenAI's shape elsewhere
