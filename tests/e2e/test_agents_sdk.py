"""The OpenAI Agents SDK drives an agent loop against the server on the default model: the model
calls a Python function tool (tool_choice required), the SDK runs it and sends the result back,
and the model answers; streamed and not, the same calls. The second turn's prompt is served from
the radix cache (its cached_tokens cover the first turn's prompt)."""

import asyncio
import json

import jsonschema
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

set_tracing_disabled(
    True
)  # tracing exports to OpenAI's servers; nothing here may reach the internet

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
}


def make_agent(server, calls):
    @function_tool(strict_mode=False)
    def get_weather(city: str) -> str:
        """Current weather in a city.

        Args:
            city: the city's name.
        """
        calls.append(city)
        return json.dumps({"city": city, "temperature_c": 18, "sky": "clear"})

    get_weather.params_json_schema["properties"]["city"]["maxLength"] = (
        24  # a greedy small model may not stop
    )
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    return Agent(
        name="weather",
        instructions="You answer questions about the weather.",
        model=OpenAIChatCompletionsModel(model="default", openai_client=client),
        tools=[get_weather],
        model_settings=ModelSettings(
            tool_choice="required", temperature=0, max_tokens=120, include_usage=True
        ),
    )


def tool_items(result):
    kinds = [type(i) for i in result.new_items]
    assert (
        kinds[0] is ToolCallItem
        and kinds[1] is ToolCallOutputItem
        and kinds[-1] is MessageOutputItem
    ), kinds
    return [
        (i.raw_item.name, i.raw_item.arguments)
        for i in result.new_items
        if isinstance(i, ToolCallItem)
    ]


def test_agent_loop_calls_the_tool_and_answers(fresh_server):
    server = fresh_server  # the cache flushed: only the first turn can have cached the second's
    calls = []
    result = Runner.run_sync(make_agent(server, calls), "What's the weather in Paris?", max_turns=4)
    made = tool_items(result)
    assert made and len(calls) == len(made)  # the SDK ran the Python function once per call
    for name, arguments in made:
        assert name == "get_weather"
        jsonschema.validate(json.loads(arguments), CITY)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    # the tool result went back: the turn after the call is a longer prompt, its prefix cached
    first, second = result.raw_responses[0].usage, result.raw_responses[1].usage
    assert second.input_tokens > first.input_tokens
    assert second.input_tokens_details.cached_tokens >= first.input_tokens


def test_streamed_run_makes_the_same_calls(server):
    plain_calls, streamed_calls = [], []
    plain = Runner.run_sync(
        make_agent(server, plain_calls), "What's the weather in Oslo?", max_turns=4
    )

    async def run_streamed():
        result = Runner.run_streamed(
            make_agent(server, streamed_calls), "What's the weather in Oslo?", max_turns=4
        )
        events = [e async for e in result.stream_events()]
        return result, events

    streamed, events = asyncio.run(run_streamed())
    assert any(e.type == "raw_response_event" for e in events)  # it really streamed
    assert tool_items(streamed) == tool_items(plain) and streamed_calls == plain_calls
    assert streamed.final_output == plain.final_output


def test_docs_example_runs(server, tmp_path):
    """docs/agents.md's Agents SDK example, as pasted into a script, against this server."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    code = re.findall(r"^```python\n(.*?)^```", doc, re.M | re.S)[1]
    assert "Runner.run_sync" in code
    script = tmp_path / "agents_sdk_example.py"
    script.write_text(code.replace("http://127.0.0.1:30000", server.url))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip()  # the agent's final answer, after the tool ran
