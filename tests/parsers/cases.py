"""Outputs each model family writes, from the formats' published specs (the chat templates and
model cards named per case), with the calls and content a parser must find in them."""

from __future__ import annotations

from dataclasses import dataclass

_STR = {"type": "string"}
# The tools the cases call, by name: OpenAI "parameters" schemas (jsonschema checks the arguments).
SCHEMAS = {
    "get_current_temperature": {
        "type": "object",
        "properties": {"location": _STR, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["location"],
        "additionalProperties": False,
    },
    "get_temperature_date": {
        "type": "object",
        "properties": {"location": _STR, "date": _STR, "unit": _STR},
        "required": ["location", "date"],
    },
    "get_stock_fundamentals": {
        "type": "object",
        "properties": {"symbol": _STR},
        "required": ["symbol"],
    },
    "get_weather": {
        "type": "object",
        "properties": {"city": _STR, "location": _STR, "metric": _STR},
        "additionalProperties": False,
    },
    "get_current_weather": {
        "type": "object",
        "properties": {"location": _STR, "format": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["location", "format"],
    },
    "search": {
        "type": "object",
        "properties": {
            "q": _STR,
            "filters": {"type": "object"},
            "exact": {"type": "boolean"},
            "limit": {"type": "integer"},
        },
        "required": ["q"],
    },
    "list_files": {"type": "object", "properties": {}},
}
TOOLS = sorted(SCHEMAS)


@dataclass(frozen=True)
class Case:
    id: str
    parser: str
    text: str
    content: str
    calls: tuple[tuple[str, dict], ...]  # (name, arguments as JSON)
    arguments: tuple[str, ...] | None = None  # the exact argument strings, where they matter


QWEN_ONE = (
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA,'
    ' USA"}}\n</tool_call>'
)
QWEN_TWO = (
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA,'
    ' USA", "unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_temperature_date",'
    ' "arguments": {"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit":'
    ' "celsius"}}\n</tool_call>'
)
SF = {"location": "San Francisco, CA, USA"}
SF_C = {**SF, "unit": "celsius"}

CASES = [
    # Qwen 2.5 / Qwen 3 (their chat templates; Qwen's function-calling guide's examples).
    Case(
        "qwen-one",
        "qwen25",
        QWEN_ONE,
        "",
        (("get_current_temperature", SF),),
        ('{"location": "San Francisco, CA, USA"}',),
    ),
    Case(
        "qwen-parallel",
        "qwen25",
        QWEN_TWO,
        "",
        (
            ("get_current_temperature", SF_C),
            ("get_temperature_date", {**SF_C, "date": "2024-10-01"}),
        ),
    ),
    Case(
        "qwen3-text-first",
        "qwen",
        "I'll check the temperature for you.\n\n" + QWEN_ONE + "\n",
        "I'll check the temperature for you.",
        (("get_current_temperature", SF),),
    ),
    Case(
        "qwen-text-around",
        "qwen25",
        "Sure: " + QWEN_ONE + " done.",
        "Sure: done.",
        (("get_current_temperature", SF),),
    ),
    # Hermes 2 Pro / Hermes 3 (model cards: arguments before name).
    Case(
        "hermes-args-first",
        "hermes",
        '<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name":'
        ' "get_stock_fundamentals"}\n</tool_call>',
        "",
        (("get_stock_fundamentals", {"symbol": "TSLA"}),),
        ('{"symbol": "TSLA"}',),
    ),
    Case(
        "hermes-two-in-one-block",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name":'
        ' "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
        "",
        (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})),
    ),
    Case(
        "hermes-tricky-json",
        "hermes",
        '<tool_call>{"name": "search", "arguments": {"q": "caf\\u00e9 \\"x\\" </tool_call> {[",'
        ' "filters": {"tags": ["a", {"b": null}], "n": -2.5e-3, "ok": true}, "exact": false,'
        ' "limit": 0}}</tool_call>',
        "",
        (
            (
                "search",
                {
                    "q": 'café "x" </tool_call> {[',
                    "filters": {"tags": ["a", {"b": None}], "n": -2.5e-3, "ok": True},
                    "exact": False,
                    "limit": 0,
                },
            ),
        ),
    ),
    Case(
        "hermes-no-end-tag",
        "hermes",
        '<tool_call>\n{"name": "list_files", "arguments": {}}\n',
        "",
        (("list_files", {}),),
    ),
    Case(
        "hermes-no-arguments",
        "hermes",
        '<tool_call>{"name": "list_files"}</tool_call>',
        "",
        (("list_files", {}),),
        ("{}",),
    ),
    Case(
        "hermes-arguments-as-string",
        "hermes",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
        "",
        (("get_weather", {"city": "Oslo"}),),
        ('{"city": "Oslo"}',),
    ),
    Case(
        "hermes-plain-text",
        "hermes",
        "Use <b>bold</b>, a < b, and <tool_c... never mind.\n",
        "Use <b>bold</b>, a < b, and <tool_c... never mind.\n",
        (),
    ),
    # Llama 3.1 / 3.2 / 3.3 (the chat templates: {"name": ..., "parameters": ...}; 3.1's
    # <|python_tag|>).
    Case(
        "llama3-bare",
        "llama3",
        '{"name": "get_weather", "parameters": {"location": "San Francisco"}}',
        "",
        (("get_weather", {"location": "San Francisco"}),),
        ('{"location": "San Francisco"}',),
    ),
    Case(
        "llama3-python-tag",
        "llama3",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    Case(
        "llama3-two",
        "llama3",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather",'
        ' "parameters": {"city": "Rome"}}',
        "",
        (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})),
    ),
    Case(
        "llama3-json-answer",
        "llama3",
        '{"name": "Ada", "age": 36}',
        '{"name": "Ada", "age": 36}',
        (),
    ),
    Case(
        "llama3-builtin-tool",
        "llama3",
        '<|python_tag|>brave_search.call(query="current weather in Menlo Park, California")',
        '<|python_tag|>brave_search.call(query="current weather in Menlo Park, California")',
        (),
    ),
    Case(
        "llama3-json-later-is-text",
        "llama3",
        'Call it as {"name": "get_weather", "parameters": {}}.',
        'Call it as {"name": "get_weather", "parameters": {}}.',
        (),
    ),
    # Mistral (Mistral-7B-Instruct-v0.3's card; the [ARGS] form of the v11 tokenizer: Small 3.2,
    # Devstral).
    Case(
        "mistral-v3",
        "mistral",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France",'
        ' "format": "celsius"}}]',
        "",
        (("get_current_weather", {"location": "Paris, France", "format": "celsius"}),),
    ),
    Case(
        "mistral-v3-two",
        "mistral",
        '[TOOL_CALLS][{"name": "get_current_weather", "arguments": {"location": "Paris, France",'
        ' "format": "celsius"}}, {"name": "get_current_weather", "arguments": {"location": "Lyon,'
        ' France", "format": "celsius"}}]',
        "",
        (
            ("get_current_weather", {"location": "Paris, France", "format": "celsius"}),
            ("get_current_weather", {"location": "Lyon, France", "format": "celsius"}),
        ),
    ),
    Case(
        "mistral-args",
        "mistral",
        'Let me look.[TOOL_CALLS]get_current_weather[ARGS]{"location": "Paris, France", "format":'
        ' "celsius"}[TOOL_CALLS]get_current_weather[ARGS]{"location": "Nice, France", "format":'
        ' "celsius"}',
        "Let me look.",
        (
            ("get_current_weather", {"location": "Paris, France", "format": "celsius"}),
            ("get_current_weather", {"location": "Nice, France", "format": "celsius"}),
        ),
    ),
    # Qwen3-Coder's XML calls (Qwen3.5's and Qwen3-Next's chat templates): raw values, JSON where
    # the template wrote JSON (its `tojson` of non-string arguments).
    Case(
        "qwen3_coder-two",
        "qwen3_coder",
        "I will check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco"
        "\n</parameter>\n<parameter=metric>\ncelsius\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSeattle\n</parameter>\n"
        "</function>\n</tool_call>",
        "I will check both.",
        (
            ("get_weather", {"city": "San Francisco", "metric": "celsius"}),
            ("get_weather", {"city": "Seattle"}),
        ),
    ),
    Case(
        "qwen3_coder-values",
        "qwen3_coder",
        '<tool_call>\n<function=search>\n<parameter=q>\nline one\n<b>two</b> "x"\n</parameter>\n'
        '<parameter=filters>\n{"tags": ["a"], "n": null}\n</parameter>\n<parameter=exact>\n'
        "true\n</parameter>\n<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>",
        "",
        (
            (
                "search",
                {
                    "q": 'line one\n<b>two</b> "x"',
                    "filters": {"tags": ["a"], "n": None},
                    "exact": True,
                    "limit": 5,
                },
            ),
        ),
    ),
    Case(
        "qwen3_coder-no-arguments",
        "qwen3_coder",
        "<tool_call>\n<function=list_files>\n</function>\n</tool_call>",
        "",
        (("list_files", {}),),
    ),
    # Pythonic (Llama 3.2 / 3.3's zero-shot format; Llama 4 wraps it in <|python_start|>...).
    Case(
        "pythonic-two",
        "pythonic",
        "[get_weather(city='San Francisco', metric='celsius'), get_weather(city='Seattle',"
        " metric='celsius')]",
        "",
        (
            ("get_weather", {"city": "San Francisco", "metric": "celsius"}),
            ("get_weather", {"city": "Seattle", "metric": "celsius"}),
        ),
        (
            '{"city": "San Francisco", "metric": "celsius"}',
            '{"city": "Seattle", "metric": "celsius"}',
        ),
    ),
    Case(
        "pythonic-llama4",
        "pythonic",
        '<|python_start|>[get_weather(city="Paris")]<|python_end|>',
        "",
        (("get_weather", {"city": "Paris"}),),
    ),
    Case(
        "pythonic-values",
        "pythonic",
        'Searching. [search(q="a]b)\\"", filters={"tags": ["x", (1, -2)], "n": None, "on": true},'
        " exact=False, limit=-3)] Done.",
        "Searching. Done.",
        (
            (
                "search",
                {
                    "q": 'a]b)"',
                    "filters": {"tags": ["x", [1, -2]], "n": None, "on": True},
                    "exact": False,
                    "limit": -3,
                },
            ),
        ),
    ),
    Case(
        "pythonic-brackets-in-prose",
        "pythonic",
        "See [1], [the docs](http://x) and x[i](y).",
        "See [1], [the docs](http://x) and x[i](y).",
        (),
    ),
    # DeepSeek V3-0324 and V3.1 (their chat templates).
    Case(
        "deepseekv3",
        "deepseekv3",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city":'
        ' "Tokyo"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city":'
        ' "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        (("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": "Paris"})),
    ),
    Case(
        "deepseekv3-text-first",
        "deepseekv3",
        "Checking.\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>list_files\n```json\n{}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Checking.",
        (("list_files", {}),),
    ),
    Case(
        "deepseekv31",
        "deepseekv31",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"location":'
        ' "Tokyo"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"location":'
        ' "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "",
        (("get_weather", {"location": "Tokyo"}), ("get_weather", {"location": "Paris"})),
    ),
    # gpt-oss's harmony calls as the harmony reasoning split hands them on (reasoning/harmony.py):
    # <|call|> is a stop token, so usually absent; " json" is the glue the chat template writes.
    Case(
        "gpt-oss",
        "gpt-oss",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"location": "Tokyo"}<|call|>',
        "",
        (("get_weather", {"location": "Tokyo"}),),
    ),
    Case(
        "gpt-oss-preamble-first",
        "gpt-oss",
        "Checking.<|channel|>commentary to=functions.get_stock_fundamentals <|constrain|>json"
        '<|message|>{"symbol": "NVDA"}',
        "Checking.",
        (("get_stock_fundamentals", {"symbol": "NVDA"}),),
    ),
    Case(
        "gpt-oss-template-glue",
        "gpt-oss",
        "<|channel|>commentary to=functions.list_files json<|message|>{}<|call|>",
        "",
        (("list_files", {}),),
    ),
    # The JSON array that tool_choice "required" forces (SGLang's schema: name + parameters).
    Case(
        "json-array",
        "json_array",
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "list_files",'
        ' "parameters": {}}]',
        "",
        (("get_weather", {"city": "Paris"}), ("list_files", {})),
    ),
]
