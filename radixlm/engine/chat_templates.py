"""`--chat-template FILE|NAME` (SGLang's flag): which chat template the OpenAI chat route renders.

As SGLang reads it: a `.jinja` file is the template itself (as the tokenizer's own would be); a
`.json` file is one of SGLang's conversation templates (name, system, user, assistant, sep_style,
sep, stop_str, system_message); anything else is a built-in name. Built-in names are SGLang's
text-only conversation templates, with SGLang's values. A conversation template becomes a Jinja
template that renders exactly what SGLang's `Conversation.get_prompt` does, so the tokenizer's
`apply_chat_template` (continue_final_message, add_generation_prompt, kwargs) works the same for
every kind; its stop strings join each chat request's, and its text is encoded with the
tokenizer's special tokens (BOS), as SGLang does for conversation templates.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Conversation:
    """SGLang's conversation template (sglang/srt/parser/conversation.py), text fields only."""

    name: str
    system_template: str = "{system_message}"
    system_message: str = ""
    roles: tuple[str, str] = ("USER", "ASSISTANT")
    sep_style: str = "ADD_COLON_SINGLE"
    sep: str = "\n"
    sep2: str | None = None
    stop_str: tuple[str, ...] = field(default_factory=tuple)


# SGLang's built-in text-only conversation templates, copied as facts (values of sglang 0.5.10).
BUILTIN_TEMPLATES: dict[str, Conversation] = {
    c.name: c
    for c in (
        Conversation(
            "llama-2",
            "[INST] <<SYS>>\n{system_message}\n<</SYS>>\n\n",
            "",
            ("[INST]", "[/INST]"),
            "LLAMA2",
            " ",
            " </s><s>",
            ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>"),
        ),
        Conversation(
            "mistral",
            "[SYSTEM_PROMPT]\n{system_message}\n[/SYSTEM_PROMPT]\n\n",
            "",
            ("[INST]", "[/INST]"),
            "LLAMA2",
            " ",
            " </s><s>",
            ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"),
        ),
        Conversation(
            "llama-4",
            "<|header_start|>system<|header_end|>\n\n{system_message}<|eot|>",
            "",
            ("user", "assistant"),
            "LLAMA4",
            "",
            None,
            ("<|end_of_text|>", "<|eot|>", "<|eom|>"),
        ),
        Conversation(
            "chatml",
            "<|im_start|>system\n{system_message}",
            "You are a helpful assistant.",
            ("<|im_start|>user", "<|im_start|>assistant"),
            "CHATML",
            "<|im_end|>",
            None,
            ("<|endoftext|>", "<|im_end|>"),
        ),
        Conversation(
            "vicuna_v1.1",
            "{system_message}",
            "A chat between a curious user and an artificial intelligence assistant. "
            "The assistant gives helpful, detailed, and polite answers to the user's questions.",
            ("USER", "ASSISTANT"),
            "ADD_COLON_TWO",
            " ",
            "</s>",
        ),
        Conversation(
            "gemma-it",
            "<start_of_turn>user\n{system_message}\n\n",
            "You are a helpful assistant.",
            ("<start_of_turn>user\n", "<start_of_turn>model\n"),
            "GEMMA3",
            "<end_of_turn>\n",
            None,
            ("<end_of_turn>",),
        ),
    )
}

# One Jinja body for every separator style: the same branches as Conversation.get_prompt. A
# message with empty content renders as an open turn, as in SGLang (it treats "" like its None).
_BODY = """\
{%- set ns = namespace(system=default_system, msgs=[]) -%}
{%- for m in messages -%}
  {%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}
  {%- elif m['role'] == 'user' -%}{%- set ns.msgs = ns.msgs + [[roles[0], m['content']]] -%}
  {%- elif m['role'] == 'assistant' -%}{%- set ns.msgs = ns.msgs + [[roles[1], m['content']]] -%}
  {%- else -%}{{ raise_exception('Unknown role: ' ~ m['role']) }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{%- set ns.msgs = ns.msgs + [[roles[1], '']] -%}{%- endif -%}
{%- set sp = system_template | replace('{system_message}', ns.system) -%}
{%- if style in ('ADD_COLON_SINGLE', 'ADD_COLON_TWO', 'ADD_COLON_SPACE_SINGLE') -%}{{ sp ~ sep }}
{%- elif style in ('ADD_NEW_LINE_SINGLE',) and sp -%}{{ sp ~ sep }}
{%- elif style == 'CHATML' and sp -%}{{ sp ~ sep ~ '\\n' }}
{%- elif style in ('LLAMA3', 'LLAMA4', 'LLAMA2') and ns.system -%}{{ sp }}
{%- elif style == 'LLAMA2' -%}{{ '[INST] ' }}
{%- elif style in ('NO_COLON_SINGLE', 'NO_COLON_TWO', 'GEMMA3') -%}{{ sp }}
{%- endif -%}
{%- for role, msg in ns.msgs -%}
  {%- set sep_i = sep if loop.index0 % 2 == 0 else sep2 -%}
  {%- if style == 'ADD_COLON_SINGLE' -%}{{ role ~ ': ' ~ msg ~ sep if msg else role ~ ':' }}
  {%- elif style == 'ADD_COLON_TWO' -%}{{ role ~ ': ' ~ msg ~ sep_i if msg else role ~ ':' }}
  {%- elif style == 'ADD_COLON_SPACE_SINGLE' -%}{{ role ~ ': ' ~ msg ~ sep if msg else role ~ ': ' }}
  {%- elif style == 'ADD_NEW_LINE_SINGLE' -%}{{ role ~ '\\n' ~ msg ~ sep if msg else role ~ '\\n' }}
  {%- elif style == 'NO_COLON_SINGLE' -%}{{ role ~ msg ~ sep if msg else role }}
  {%- elif style == 'NO_COLON_TWO' -%}{{ role ~ msg ~ sep_i if msg else role }}
  {%- elif style == 'CHATML' -%}{{ role ~ '\\n' ~ msg ~ sep ~ '\\n' if msg else role ~ '\\n' }}
  {%- elif style == 'LLAMA3' -%}{{ '<|start_header_id|>' ~ role ~ '<|end_header_id|>\\n\\n' }}
    {%- if msg -%}{{ msg | trim ~ '<|eot_id|>' }}{%- endif -%}
  {%- elif style == 'LLAMA4' -%}{{ '<|header_start|>' ~ role ~ '<|header_end|>\\n\\n' }}
    {%- if msg -%}{{ msg | trim ~ '<|eot|>' }}{%- endif -%}
  {%- elif style == 'LLAMA2' -%}
    {%- if not msg -%}{{ roles[loop.index0 % 2] }}
    {%- elif loop.first -%}{{ msg ~ ' ' }}
    {%- else -%}{{ roles[loop.index0 % 2] ~ ' ' ~ msg ~ sep_i }}{%- endif -%}
  {%- elif style == 'GEMMA3' -%}{{ (msg ~ sep if loop.first else role ~ msg ~ sep) if msg else role }}
  {%- endif -%}
{%- endfor -%}"""

SEP_STYLES = (
    "ADD_COLON_SINGLE",
    "ADD_COLON_TWO",
    "ADD_COLON_SPACE_SINGLE",
    "ADD_NEW_LINE_SINGLE",
    "NO_COLON_SINGLE",
    "NO_COLON_TWO",
    "CHATML",
    "LLAMA2",
    "LLAMA3",
    "LLAMA4",
    "GEMMA3",
)


def conversation_jinja(conv: Conversation) -> str:
    """The Jinja template that renders `conv` as SGLang does (its values as Jinja literals
    first)."""
    if conv.sep_style not in SEP_STYLES:
        raise ValueError(
            f"chat template {conv.name!r}: sep_style {conv.sep_style} is not supported "
            f"(supported: {', '.join(SEP_STYLES)})"
        )
    values = {
        "default_system": conv.system_message,
        "system_template": conv.system_template,
        "roles": list(conv.roles),
        "style": conv.sep_style,
        "sep": conv.sep,
        "sep2": conv.sep2 or "",
    }
    # json.dumps writes string and list literals that Jinja reads back unchanged.
    return (
        "".join(
            f"{{%- set {k} = {json.dumps(v, ensure_ascii=False)} -%}}" for k, v in values.items()
        )
        + _BODY
    )


@dataclass(frozen=True)
class ChatTemplate:
    """What `--chat-template` resolved to. jinja None: the tokenizer's own template."""

    jinja: str | None = None
    stop: tuple[str, ...] = ()
    encode_special_tokens: bool = False  # conversation templates write no BOS: the encoder adds it


def _conversation_from_json(path: str) -> Conversation:
    """SGLang's JSON conversation file (template_manager._load_json_chat_template)."""
    with open(path, encoding="utf-8") as f:
        t = json.load(f)
    try:
        stop = t["stop_str"]
        return Conversation(
            name=t["name"],
            system_template=t["system"] + "\n{system_message}",
            system_message=t.get("system_message", ""),
            roles=(t["user"], t["assistant"]),
            sep_style=t["sep_style"],
            sep=t.get("sep", "\n"),
            stop_str=tuple([stop] if isinstance(stop, str) else stop or ()),
        )
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"--chat-template {path}: a JSON conversation template needs name, system, user, "
            f"assistant, sep_style and stop_str ({type(e).__name__}: {e})"
        ) from None


def _check_jinja(source: str, where: str) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:  # the environment transformers renders chat templates in
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except TemplateSyntaxError as e:
        raise ValueError(
            f"--chat-template {where}: not a valid Jinja template (line {e.lineno}: {e.message})"
        ) from None


@functools.lru_cache(maxsize=8)
def resolve_chat_template(spec: str | None) -> ChatTemplate:
    """`--chat-template`'s value -> ChatTemplate; a ValueError naming the flag when it is neither a
    readable template file nor a built-in name. Cached: the chat route asks again for the stops."""
    if not spec:
        return ChatTemplate()
    if spec in BUILTIN_TEMPLATES and not os.path.exists(spec):
        conv = BUILTIN_TEMPLATES[spec]
        return ChatTemplate(conversation_jinja(conv), conv.stop_str, True)
    if not os.path.isfile(spec):
        raise ValueError(
            f"--chat-template {spec!r} is neither a template file (.jinja, or SGLang's .json) nor a"
            f" built-in name ({', '.join(sorted(BUILTIN_TEMPLATES))})"
        )
    if spec.endswith(".json"):
        conv = _conversation_from_json(spec)
        return ChatTemplate(conversation_jinja(conv), conv.stop_str, True)
    with open(
        spec, encoding="utf-8"
    ) as f:  # as SGLang: outer newlines dropped, literal \n made newlines
        source = f.read().strip("\n").replace("\\n", "\n")
    _check_jinja(source, spec)
    return ChatTemplate(source)


def apply_chat_template_option(tokenizer, spec: str | None) -> ChatTemplate:
    """Installs the template on the served tokenizer (what every chat rendering reads)."""
    chosen = resolve_chat_template(spec)
    if chosen.jinja is not None:
        tokenizer.chat_template = chosen.jinja
    return chosen
