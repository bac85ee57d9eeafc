"""The reasoning formats by their `--reasoning-parser` names (SGLang's), and when a request thinks.

A format is its markers plus how a request turns thinking on: some models always think
(DeepSeek-R1), hybrids switch by a chat_template_kwargs key (Qwen3's enable_thinking, on unless
false; DeepSeek-V3.1's thinking, off unless true), Mistral by reasoning_effort. When a request
thinks, the chat template has usually opened the block in the prompt already (R1's "<think>\\n"),
so the output starts inside it: the parser is `forced` (SGLang's force_reasoning).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from radixlm.registry import Registry


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    # A tool call that ends the thinking without the end marker (GLM-4.5, Kimi K2); it is content.
    tool_start: str | None = None
    switch: str | None = None  # the chat_template_kwargs key that turns thinking on and off
    on_by_default: bool = True  # with a switch: thinking when the key is absent
    by_effort: bool = False  # thinking when reasoning_effort is set and not "none" (Mistral)
    opens_in_prompt: bool = True  # a thinking request's output starts inside the block
    # gpt-oss's harmony: reasoning is a channel of messages (reasoning/harmony.py), not a block
    # the prompt opens or a budget can close; its control tokens are special tokens.
    harmony: bool = False

    def thinks(
        self, chat_template_kwargs: Mapping | None = None, reasoning_effort: str | None = None
    ) -> bool:
        """Whether this request thinks (SGLang's _get_reasoning_from_request)."""
        if self.harmony:
            return False  # no think block to start inside (reasoning_effort goes to the template)
        if self.by_effort:
            return reasoning_effort is not None and reasoning_effort != "none"
        if self.switch is None:
            return True
        value = (chat_template_kwargs or {}).get(self.switch)
        return value is not False if self.on_by_default else value is True

    def forced(
        self, chat_template_kwargs: Mapping | None = None, reasoning_effort: str | None = None
    ) -> bool:
        """Whether the output starts inside the think block (without its opening marker)."""
        return self.opens_in_prompt and self.thinks(chat_template_kwargs, reasoning_effort)


_QWEN3 = dict(switch="enable_thinking")  # thinks unless enable_thinking is false

# --reasoning-parser: a format per name, in alphabetical order (the order of the choices).
REASONING_PARSER_REGISTRY = Registry[ReasoningFormat, None]("reasoning parser")
REASONING_PARSER_REGISTRY.register("deepseek-r1", ReasoningFormat("deepseek-r1"))
# DeepSeek-V3.1, a hybrid.
REASONING_PARSER_REGISTRY.register(
    "deepseek-v3", ReasoningFormat("deepseek-v3", switch="thinking", on_by_default=False)
)
# gpt-oss: the analysis channel (start / end: its message, for the engine's think markers).
REASONING_PARSER_REGISTRY.register(
    "gpt-oss",
    ReasoningFormat(
        "gpt-oss",
        start="<|channel|>analysis<|message|>",
        end="<|end|>",
        opens_in_prompt=False,
        harmony=True,
    ),
)
REASONING_PARSER_REGISTRY.register(
    "glm45", ReasoningFormat("glm45", tool_start="<tool_call>", **_QWEN3)
)
REASONING_PARSER_REGISTRY.register("interns1", ReasoningFormat("interns1", **_QWEN3))
REASONING_PARSER_REGISTRY.register(
    "kimi", ReasoningFormat("kimi", start="◁think▷", end="◁/think▷", opens_in_prompt=False)
)
REASONING_PARSER_REGISTRY.register(
    "kimi_k2",
    ReasoningFormat("kimi_k2", tool_start="<|tool_calls_section_begin|>", switch="thinking"),
)
REASONING_PARSER_REGISTRY.register(
    "mimo", ReasoningFormat("mimo", switch="enable_thinking", on_by_default=False)
)
REASONING_PARSER_REGISTRY.register("minimax", ReasoningFormat("minimax"))
REASONING_PARSER_REGISTRY.register(
    "mistral", ReasoningFormat("mistral", start="[THINK]", end="[/THINK]", by_effort=True)
)
REASONING_PARSER_REGISTRY.register("qwen3", ReasoningFormat("qwen3", **_QWEN3))
# Qwen3-*-Thinking-2507, QwQ.
REASONING_PARSER_REGISTRY.register("qwen3-thinking", ReasoningFormat("qwen3-thinking"))
REASONING_PARSER_REGISTRY.register("step3", ReasoningFormat("step3"))

# The choices of --reasoning-parser.
REASONING_PARSERS: tuple[str, ...] = REASONING_PARSER_REGISTRY.names()


def get_reasoning_format(name: str) -> ReasoningFormat:
    """The format for a --reasoning-parser name (any case); ValueError naming the choices."""
    if name.lower() not in REASONING_PARSER_REGISTRY:
        raise REASONING_PARSER_REGISTRY.unknown(name)
    return REASONING_PARSER_REGISTRY.get(name.lower())


# A generation prompt that ends with "<think>\n": the template opens the block itself (Qwen3
# Thinking-2507, QwQ, DeepSeek-R1-0528). In the Jinja source the newline may be escaped.
_OPENS_THINK = re.compile(r"(<\|im_start\|>assistant|<｜Assistant｜>)(\\n|\n)?<think>(\\n|\n)")


def detect_reasoning_parser(template: str | None) -> str | None:
    """The --reasoning-parser a chat template needs without the flag: gpt-oss for a harmony
    template (its channels are the output's structure, not an option), else None."""
    return "gpt-oss" if isinstance(template, str) and "<|channel|>" in template else None


def template_opens_thinking(template: str | None) -> bool:
    """SGLang's TemplateManager check: the chat template opens the think block in the prompt,
    so even a format that does not open it by itself must start inside it."""
    return bool(template) and _OPENS_THINK.search(template) is not None
