"""Servers for the dashboard tests (the tiny random model; per package: stopped once these tests are
done, not left polling for the rest of the run), and the browser: Debian's chromium
driven by Playwright's client (executable_path; never `playwright install`, which downloads from
a CDN). Where either is missing the browser tests are skipped, and the summary says why; under
RADIXLM_REQUIRE_BROWSER=1 (set by .ci/run) they fail instead."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import pytest

from radixlm.server.process import ServerProcess
from tests.conftest import flush_cache

KEY = "dash-user-key-0123456789"
ADMIN_KEY = "dash-admin-key-9876543210"
TINY = ("--num-threads", "1", "--kv-memory-gb", "0.05", "--enable-invariant-checks")

SKIP_PREFIX = "dashboard browser tests not run: "


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if shutil.which("chromium") is None:
        return "no chromium on PATH (Debian: apt-get install -y chromium; .ci/run installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is missing (pip install -e '.[test]')"
    return None


def browser_skip_reason() -> str | None:
    """Why the browser tests are skipped here, or None: they run, or (RADIXLM_REQUIRE_BROWSER=1, as
    .ci/run sets) they must, and a missing browser fails them by name."""
    why = browser_missing()
    if why is None or os.environ.get("RADIXLM_REQUIRE_BROWSER") == "1":
        return None
    return f"{SKIP_PREFIX}{why}"


@pytest.fixture(scope="package")
def keyed_server(tiny_model_dir):
    """--api-key and --dashboard-show-text: the dashboard's data needs the key, the tree has
    text."""
    s = ServerProcess(
        "--model-path",
        tiny_model_dir,
        *TINY,
        "--dashboard-show-text",
        env={"RADIXLM_API_KEY": KEY, "RADIXLM_ADMIN_API_KEY": ADMIN_KEY},
    )
    yield s
    s.stop()


@pytest.fixture(scope="package")
def open_server(tiny_server_process):
    """No key, no text (the defaults): the run's shared tiny-model server (tests/conftest.py), its
    cache flushed when these tests start (a test that counts on its contents flushes it too)."""
    flush_cache(tiny_server_process.url)
    return tiny_server_process


@pytest.fixture(scope="package")
def router(keyed_server, open_server):
    """`radixlm router` in front of both (the open server, on loopback without a key, takes any)."""

    def cmd(port):
        return [
            sys.executable,
            "-m",
            "radixlm.cli",
            "router",
            "--port",
            str(port),
            "--worker-urls",
            keyed_server.url,
            open_server.url,
            "--health-check-interval-secs",
            "0.5",
            "--health-success-threshold",
            "1",
            "--log-level",
            "warning",
        ]

    r = ServerProcess(command=cmd, name="the router", env={"RADIXLM_WORKER_API_KEY": KEY})
    yield r
    r.stop()


@pytest.fixture(scope="module")
def browser():
    """Module scope: Playwright's sync API keeps an event loop running on the main thread while it
    is open, so a session-wide browser would make every later test's asyncio.run() fail."""
    why = browser_missing()
    if (
        why is not None
    ):  # only reached under RADIXLM_REQUIRE_BROWSER=1: elsewhere the module is skipped
        pytest.fail(
            f"the dashboard browser tests must run here (RADIXLM_REQUIRE_BROWSER=1) but {why}"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI containers run as root, where Chromium's sandbox cannot start.
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, tmp_path):
    """A fresh page that records console errors and uncaught exceptions; a screenshot of it lands in
    the test's tmp dir at the end."""
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    pg = context.new_page()
    pg.errors = []
    pg.on(
        "console",
        lambda m: pg.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    pg.on("pageerror", lambda e: pg.errors.append(f"page error: {e}"))
    yield pg
    pg.screenshot(path=str(tmp_path / "final.png"), full_page=True)
    context.close()


def pytest_terminal_summary(terminalreporter):
    """`pytest -q` prints no skip reasons: say once why the browser tests did not run."""
    reasons = [
        r.longrepr[2]
        for r in terminalreporter.stats.get("skipped", [])
        if isinstance(r.longrepr, tuple) and SKIP_PREFIX in r.longrepr[2]
    ]
    if reasons:
        why = reasons[0][reasons[0].index(SKIP_PREFIX) :]
        terminalreporter.write_line(f"{len(reasons)} {why}", yellow=True)
