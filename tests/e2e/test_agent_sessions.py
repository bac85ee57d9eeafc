"""Coding agents' sessions stay cached (issue 92): a replayed Claude Code session of 6 turns through
/v1/messages with the official `anthropic` client (its request shapes: the rotating billing line
as the first system block, cache_control marks, its tools, tool_use / tool_result turns,
streaming; tests/e2e/claude_code_session.py). With the billing line normalized (the default),
every turn after the first reads >= 95% of the previous turn's prompt from the cache; with
--disable-billing-header-normalization the rotating line costs what it costs (printed, and far
below). A malformed billing line or cache_control is served unchanged, never a 5xx. Served by the
tiny Llama (the default model's tokenizer and template, a 4k context), one server per module and
one with the normalization off."""

from __future__ import annotations

import json
import random
import shutil

import anthropic
import openai
import pytest
import requests

from radixlm.server.process import ServerProcess
from tests.conftest import TINY_SERVE
from tests.e2e.claude_code_session import CODEX_TURNS, codex_request, system_blocks
from tests.e2e.claude_code_session import requests as session_requests

KEY = "agent-session-key-0123456789"


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny Llama (the default model's tokenizer and chat template) with a 4k context: the
    sessions' prompts are ~2k tokens. What the tests count, cache reads, does not depend on the
    model's weights; prefilling them on the default model would be most of the module's time."""
    path = tmp_path_factory.mktemp("tiny-4k")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 4096
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def start(model_dir: str, *flags: str) -> ServerProcess:
    return ServerProcess(
        "--model-path", model_dir, *TINY_SERVE, *flags, env={"RADIXLM_API_KEY": KEY}
    )


@pytest.fixture(scope="module")
def server(model_dir):
    s = start(model_dir)
    yield s
    s.stop()


def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def replay(claude: anthropic.Anthropic, seed: int, turns: int = 6) -> list[tuple[int, int]]:
    """The session's first `turns` requests, streamed as Claude Code sends them: (prompt, cache
    read) each."""
    out = []
    for body in session_requests(random.Random(seed))[:turns]:
        with claude.messages.stream(
            model="claude-sonnet-5-5", max_tokens=4, extra_body={"temperature": 0}, **body
        ) as stream:
            final = stream.get_final_message()
        u = final.usage
        out.append((u.input_tokens + u.cache_read_input_tokens, u.cache_read_input_tokens))
    return out


def test_claude_code_session_reads_each_previous_prompt_from_the_cache(server):
    turns = replay(client(server), seed=1)
    print("normalized: (prompt, cache_read) per turn:", turns)
    assert turns[0][0] > 1200, "the tools + instructions prefix is the session's bulk"
    for (prev, _), (prompt, read) in zip(turns, turns[1:]):
        assert prompt > prev and read >= 0.95 * prev, turns


def test_without_normalization_the_rotating_line_costs_the_prefix(model_dir):
    off = start(model_dir, "--disable-billing-header-normalization")
    try:
        turns = replay(client(off), seed=2, turns=3)  # each turn re-prefills: three show it
    finally:
        off.stop()
    reads = [read / prev for (prev, _), (_, read) in zip(turns, turns[1:])]
    print("not normalized: (prompt, cache_read) per turn:", turns, "read shares:", reads)
    # The line differs from the previous request's a few tokens in: nothing after it is reused.
    assert all(share < 0.05 for share in reads), reads


def test_malformed_billing_line_and_cache_control_are_served_unchanged(server):
    """Lines not of the billing shape are not normalized (two requests differing in such a line
    share only the tokens before it); odd cache_control values are accepted as ever (200)."""
    claude = client(server)
    base = dict(model="claude-sonnet-5-5", max_tokens=2, extra_body={"temperature": 0})
    user = [{"role": "user", "content": "hi"}]
    head = "x-anthropic-billing-header: cc_version=2.1.177.01c"
    for line, variant in (
        (head + " cc_entrypoint=cli cch=36ee5", head + " cc_entrypoint=cli cch=36ee9"),  # no ";"
        (head + "; cc_entrypoint=cli; cch=zz9x1;", head + "; cc_entrypoint=cli; cch=zz9x7;"),
    ):
        for text in (line, variant):
            msg = claude.messages.create(system=system_blocks(text), messages=user, **base)
        read, new = msg.usage.cache_read_input_tokens, msg.usage.input_tokens
        # Rewritten, the two would be one prompt; as they came, they part near the line's end.
        assert read < 0.2 * (read + new), f"{line!r} was rewritten: {read} of {read + new}"
    odd = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": "x"}]},
    ]
    for cache_control in ({"type": "ephemeral", "ttl": "1h"}, {"type": "persistent"}, {}):
        body = dict(base, system=system_blocks("x-anthropic-billing-header: ;"))
        r = requests.post(
            server.url + "/v1/messages",
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
            json={
                **{k: v for k, v in body.items() if k != "extra_body"},
                "messages": odd,
                "cache_control": cache_control,
            },
            timeout=120,
        )
        assert r.status_code == 200, r.text


def test_codex_session_through_responses_reads_each_previous_prompt_from_the_cache(server):
    """Codex's shape through /v1/responses (the `openai` client, streamed, function tools,
    reasoning items), continued with previous_response_id: each turn reads >= 95% of the previous
    turn's prompt from the cache."""
    oai = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    previous, turns = None, []
    for turn in CODEX_TURNS:
        stream = oai.responses.create(
            model="gpt-5-codex", max_output_tokens=4, **codex_request(turn, previous)
        )
        # max_output_tokens cuts the answer: the stream ends with response.incomplete.
        done = [e for e in stream if e.type in ("response.completed", "response.incomplete")]
        assert len(done) == 1
        response = done[0].response
        previous = response.id
        u = response.usage
        turns.append((u.input_tokens, u.input_tokens_details.cached_tokens))
    print("codex: (prompt, cached) per turn:", turns)
    assert turns[0][0] > 1200
    for (prev, _), (prompt, read) in zip(turns, turns[1:]):
        assert prompt > prev and read >= 0.95 * prev, turns
