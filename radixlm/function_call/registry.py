"""The tool-call formats by their `--tool-call-parser` names (SGLang's names for the same
formats), and the one SGLang uses without a name: the JSON array that tool_choice "required" or a
named function forces (json_array)."""

from __future__ import annotations

from collections.abc import Callable

from radixlm.function_call.block import ToolCallFormat
from radixlm.function_call.deepseek import DeepSeekFormat
from radixlm.function_call.hermes import HermesFormat
from radixlm.function_call.json_array import JsonArrayFormat
from radixlm.function_call.llama3 import Llama3Format
from radixlm.function_call.mistral import MistralFormat
from radixlm.function_call.pythonic import PythonicFormat

JSON_ARRAY = "json_array"

_FORMATS: dict[str, Callable[[], ToolCallFormat]] = {
    "hermes": lambda: HermesFormat("hermes"),
    "qwen25": lambda: HermesFormat("qwen25", newlines=True),
    "qwen": lambda: HermesFormat("qwen", newlines=True),  # Qwen 2.5 and Qwen 3 (not Qwen3-Coder)
    "llama3": Llama3Format,
    "mistral": MistralFormat,
    "pythonic": PythonicFormat,
    "deepseekv3": DeepSeekFormat,
    "deepseekv31": lambda: DeepSeekFormat(v31=True),
}

# The choices of --tool-call-parser.
TOOL_CALL_PARSERS: tuple[str, ...] = tuple(sorted(_FORMATS))


def get_tool_call_format(name: str) -> ToolCallFormat:
    """The format for a --tool-call-parser name (or JSON_ARRAY); ValueError naming the choices."""
    if name == JSON_ARRAY:
        return JsonArrayFormat()
    try:
        return _FORMATS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; choose from {', '.join(TOOL_CALL_PARSERS)}"
        ) from None
