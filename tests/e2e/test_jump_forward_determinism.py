"""Jump-forward (on by default) leaves a greedy answer independent of `stream` and of what the
radix cache holds: a request whose grammar forces text re-tokenizes its last tokens with that
text by one rule, streamed or not, fresh or after the same request cached its prompt and output
(scheduler/output/jump_forward.py). The default model, tool_choice "required" over 20 tools: a
grammar with many forced pieces ({"name": ", the argument keys)."""

import openai
import pytest
import requests

from tests.e2e.test_tool_calls import MAX, PROMPTS, TOOLS


def answer(server, prompt, stream):
    """The greedy forced calls [(name, arguments)], whole or assembled from the stream."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": MAX,
    }
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    if not stream:
        r = client.chat.completions.create(**body)
        return [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
    calls = {}
    for chunk in client.chat.completions.create(stream=True, **body):
        deltas = [tc for c in chunk.choices for tc in c.delta.tool_calls or []]
        for tc in deltas:
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (tc.function.name or name, args + (tc.function.arguments or ""))
    return [calls[i] for i in sorted(calls)]


def jumped(server) -> int:
    info = requests.get(server.url + "/get_server_info").json()
    return info["internal_state"]["jump_forward_tokens"]


@pytest.mark.parametrize("i", [0])
def test_streamed_and_whole_fresh_and_cached_give_the_same_greedy_call(server, i):
    # server: the run's shared default-model server (jump-forward on: the default); its counter
    # counts earlier tests' jumps too, so this test's own are the difference.
    assert requests.post(server.url + "/flush_cache").status_code == 200
    before = jumped(server)
    fresh_whole = answer(server, PROMPTS[i], stream=False)
    cached_stream = answer(server, PROMPTS[i], stream=True)  # prompt and the answer's tokens cached
    assert requests.post(server.url + "/flush_cache").status_code == 200
    fresh_stream = answer(server, PROMPTS[i], stream=True)
    cached_whole = answer(server, PROMPTS[i], stream=False)
    assert fresh_whole and fresh_whole[0][1]
    assert jumped(server) > before  # the answers went through jump-forward
    assert cached_stream == fresh_whole
    assert fresh_stream == fresh_whole
    assert cached_whole == fresh_whole
