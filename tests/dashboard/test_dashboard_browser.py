"""The dashboard in headless Chromium (Debian's chromium, Playwright's client; skipped with the
reason in the summary where either is missing): the page loads without console errors, its charts
move while requests run, the tree shows a shared prefix with both children (its text on hover,
with --dashboard-show-text), the playground round-trips a JSON-schema answer (the same as the
openai client gets), the data needs the key where the server has one, and the router's page lists
both workers. Each test leaves a screenshot in its tmp dir."""

from __future__ import annotations

import json
import threading
import time

import jsonschema
import openai
import pytest
import requests
from transformers import AutoTokenizer

from tests.dashboard.conftest import ADMIN_KEY, KEY, browser_skip_reason
from tests.dashboard.test_dashboard_stream import PROMPTS, common_prefix, generate

# Checked before any server starts: where no browser can run, nothing is started for nothing.
pytestmark = pytest.mark.skipif(
    browser_skip_reason() is not None, reason=str(browser_skip_reason())
)

LIVE = "#status.good"
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "count"],
    "additionalProperties": False,
}


def wait_js(page, expr, timeout=20.0):
    """Poll a JS expression until truthy (page.wait_for_function evaluates a string with eval, which
    the page's Content-Security-Policy forbids; page.evaluate does not)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expr):
        assert time.monotonic() < deadline, f"timed out waiting for {expr}"
        page.wait_for_timeout(100)


def chart_data(page, name):
    return page.evaluate(f"window.radixlmDashboard.charts[{json.dumps(name)}].data")


def canvas(page, name):
    return page.evaluate(f"document.querySelector('[data-chart={name}] canvas').toDataURL()")


def enter_key(page, key):
    page.wait_for_selector("#keyform:not([hidden])")
    page.fill("#apikey", key)
    page.click("#keyform button")


def test_page_loads_without_console_errors(open_server, page, tmp_path):
    page.goto(open_server.url + "/dashboard")
    page.wait_for_selector(LIVE)
    wait_js(page, "window.radixlmDashboard.charts.throughput.data[0].length >= 3")
    assert page.is_hidden("#keyform")
    assert page.text_content("#model") != ""
    assert page.errors == []
    page.screenshot(path=str(tmp_path / "loaded.png"), full_page=True)


def test_charts_move_while_requests_run(open_server, page, tmp_path):
    page.goto(open_server.url + "/dashboard")
    wait_js(page, "window.radixlmDashboard.charts.throughput.data[0].length >= 2")
    idle = canvas(page, "throughput")
    assert (
        max(v or 0 for v in chart_data(page, "throughput")[1]) == 0
    )  # nothing ran yet on this page's watch
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            generate(open_server.url, f"load {i}: tell me a long story about the sea", n=32)
            i += 1

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_js(
            page,
            "Math.max(...window.radixlmDashboard.charts.throughput.data[1].map(v => v || 0)) > 0",
            timeout=30,
        )
        wait_js(
            page, "Math.max(...window.radixlmDashboard.charts.requests.data[1]) > 0", timeout=30
        )
        page.screenshot(path=str(tmp_path / "under_load.png"), full_page=True)
        assert canvas(page, "throughput") != idle  # the chart's pixels moved
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert page.errors == []


def test_tree_shows_the_shared_node_with_both_children(
    keyed_server, page, tiny_model_dir, tmp_path
):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    shared = common_prefix(*(tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS))
    admin, user = {"Authorization": f"Bearer {ADMIN_KEY}"}, {"Authorization": f"Bearer {KEY}"}
    assert (
        requests.post(keyed_server.url + "/flush_cache", headers=admin, timeout=30).status_code
        == 200
    )
    page.goto(keyed_server.url + "/dashboard")
    enter_key(page, KEY)
    page.wait_for_selector(LIVE)
    for p in PROMPTS:
        generate(keyed_server.url, p, user)
    node = page.wait_for_selector(f'g.node[data-depth="{len(shared)}"][data-children="2"]')
    node_id = node.get_attribute("data-id")
    assert page.locator(f'g.node[data-parent="{node_id}"]').count() == 2
    page.hover(f'g.node[data-id="{node_id}"]')
    page.wait_for_selector("#treetip:not([hidden])")
    assert page.text_content("#treetip").split("\n")[0] == tok.decode(shared)
    page.screenshot(path=str(tmp_path / "tree.png"), full_page=True)


def test_the_page_data_needs_the_key(keyed_server, page):
    page.goto(keyed_server.url + "/dashboard")
    enter_key(page, "a-wrong-key")
    page.wait_for_selector("#keyform:not([hidden])")  # asked again: the wrong key got a 401
    assert "API key" in page.text_content("#keymsg") and chart_data(page, "throughput")[0] == []
    enter_key(page, KEY)
    wait_js(page, "window.radixlmDashboard.charts.throughput.data[0].length >= 2")
    page.reload()  # entered once: the tab keeps it
    wait_js(page, "window.radixlmDashboard.charts.throughput.data[0].length >= 1")
    assert page.is_hidden("#keyform")


def test_playground_round_trips_a_json_schema_answer(open_server, page, tmp_path):
    question = "Pick a color and a count."
    page.goto(open_server.url + "/dashboard")
    page.wait_for_selector(LIVE)
    page.fill("#pgtemperature", "0")
    page.fill("#pgmaxtokens", "128")
    page.select_option("#pgconstraint", "json_schema")
    page.fill("#pgconstrainttext", json.dumps(SCHEMA))
    page.fill("#pginput", question)
    page.click("#pgsend")
    done = page.wait_for_selector(".turn.assistant.done", timeout=60_000)
    answer = done.query_selector(".content").text_content()
    jsonschema.validate(json.loads(answer), SCHEMA)
    meta = done.query_selector(".turnmeta")
    client = openai.OpenAI(base_url=open_server.url + "/v1", api_key="none")
    ref = client.chat.completions.create(
        model=page.text_content("#model"),
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=128,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "playground", "schema": SCHEMA},
        },
    )
    assert answer == ref.choices[0].message.content  # streamed in the page, whole for the client
    assert int(meta.get_attribute("data-prompt-tokens")) == ref.usage.prompt_tokens
    assert "cached" in meta.text_content()
    # A second turn carries the first: most of its prompt comes from the cache.
    page.fill("#pginput", "Another one.")
    page.click("#pgsend")
    wait_js(page, "document.querySelectorAll('.turn.assistant.done').length == 2", timeout=60)
    second = page.query_selector_all(".turn.assistant.done .turnmeta")[1]
    assert int(second.get_attribute("data-cached")) >= ref.usage.prompt_tokens - 8
    page.screenshot(path=str(tmp_path / "playground.png"), full_page=True)
    assert page.errors == []


def test_router_page_lists_both_workers(router, keyed_server, open_server, page):
    page.goto(router.url + "/dashboard")
    page.wait_for_selector(LIVE)
    wait_js(page, "document.querySelectorAll('.worker[data-healthy=true]').length == 2")
    urls = {e.get_attribute("data-worker") for e in page.query_selector_all(".worker")}
    assert urls == {keyed_server.url, open_server.url}
    wait_js(
        page,
        "[...window.radixlmDashboard.cards.values()].every(c => c.charts.requests.data[0].length"
        " >= 2)",
    )
    assert page.errors == []
