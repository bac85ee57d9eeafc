"""Which tool-call parser a model needs, read from its chat template (the Jinja source from
tokenizer_config.json or the GGUF's tokenizer.chat_template): a template writes the model's
past calls back in the model's own syntax, so its markers name the format. None when the
template shows no format we parse (no tools at all, as SmolLM2's).
"""

from __future__ import annotations

from radixlm.function_call.deepseek import CALLS_BEGIN, FENCE_OPEN
from radixlm.function_call.harmony import CHANNEL as HARMONY_CHANNEL
from radixlm.function_call.hermes import BEGIN as TOOL_CALL_TAG
from radixlm.function_call.llama3 import PYTHON_TAG
from radixlm.function_call.mistral import TOOL_CALLS
from radixlm.function_call.pythonic import PYTHON_START


def detect_tool_call_parser(template: str | None) -> str | None:
    """A --tool-call-parser name for this chat template, or None if it cannot tell."""
    if not template:
        return None
    t = template
    if HARMONY_CHANNEL in t:
        return "gpt-oss"  # harmony (gpt-oss): calls are commentary-channel messages
    if CALLS_BEGIN in t or "tool▁calls▁begin" in t:
        # V3 writes "function<｜tool▁sep｜>name\n```json\n..."; V3.1 "name<｜tool▁sep｜>{...}".
        return "deepseekv3" if FENCE_OPEN in t else "deepseekv31"
    if TOOL_CALLS in t:
        return "mistral"
    if PYTHON_START in t or "<|header_start|>" in t:
        return "pythonic"  # Llama 4 (SGLang's advice for it)
    if PYTHON_TAG in t or ("<|start_header_id|>" in t and '"parameters"' in t):
        return "llama3"  # 3.1 / 3.3 name <|python_tag|>; 3.2 only writes {"name", "parameters"}
    if TOOL_CALL_TAG in t:
        if "<function=" in t:
            return "qwen3_coder"  # XML calls (<function=name><parameter=...>): Qwen3.5, Qwen3-Coder
        return "qwen25" if ("Qwen" in t or "# Tools" in t) else "hermes"
    return None
