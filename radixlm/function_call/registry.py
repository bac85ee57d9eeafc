"""The tool-call formats by their `--tool-call-parser` names (SGLang's names for the same
formats), and the one SGLang uses without a name: the JSON array that tool_choice "required" or a
named function forces (json_array)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from radixlm.function_call.block import ToolCallFormat
from radixlm.function_call.deepseek import DeepSeekFormat
from radixlm.function_call.harmony import HarmonyFormat
from radixlm.function_call.hermes import HermesFormat
from radixlm.function_call.json_array import JsonArrayFormat
from radixlm.function_call.llama3 import Llama3Format
from radixlm.function_call.mistral import MistralFormat
from radixlm.function_call.pythonic import PythonicFormat
from radixlm.function_call.qwen3_coder import Qwen3CoderFormat
from radixlm.registry import Registry

JSON_ARRAY = "json_array"

# --tool-call-parser: a format factory per name, in alphabetical order (the order of the choices).
TOOL_CALL_PARSER_REGISTRY = Registry[Callable[[], ToolCallFormat], None]("tool-call parser")
TOOL_CALL_PARSER_REGISTRY.register("deepseekv3", DeepSeekFormat)
TOOL_CALL_PARSER_REGISTRY.register("deepseekv31", functools.partial(DeepSeekFormat, v31=True))
TOOL_CALL_PARSER_REGISTRY.register("gpt-oss", HarmonyFormat)  # harmony's commentary channel
TOOL_CALL_PARSER_REGISTRY.register("hermes", functools.partial(HermesFormat, "hermes"))
TOOL_CALL_PARSER_REGISTRY.register("llama3", Llama3Format)
TOOL_CALL_PARSER_REGISTRY.register("mistral", MistralFormat)
TOOL_CALL_PARSER_REGISTRY.register("pythonic", PythonicFormat)
# Qwen 2.5 and Qwen 3 (not Qwen3-Coder).
TOOL_CALL_PARSER_REGISTRY.register("qwen", functools.partial(HermesFormat, "qwen", newlines=True))
TOOL_CALL_PARSER_REGISTRY.register(
    "qwen25", functools.partial(HermesFormat, "qwen25", newlines=True)
)
# Qwen3-Coder's XML calls, Qwen3.5's and Qwen3-Next's too.
TOOL_CALL_PARSER_REGISTRY.register("qwen3_coder", Qwen3CoderFormat)

# The choices of --tool-call-parser.
TOOL_CALL_PARSERS: tuple[str, ...] = TOOL_CALL_PARSER_REGISTRY.names()


def get_tool_call_format(name: str) -> ToolCallFormat:
    """The format for a --tool-call-parser name (or JSON_ARRAY); ValueError naming the choices."""
    if name == JSON_ARRAY:
        return JsonArrayFormat()
    return TOOL_CALL_PARSER_REGISTRY.get(name)()
