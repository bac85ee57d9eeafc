"""--chat-template's built-in names and SGLang JSON conversation files render exactly what SGLang's
own Conversation.get_prompt renders (tests/sglang_conversation.py), through the tokenizer's
apply_chat_template as the chat route calls it."""

import json

import pytest

from radixlm.engine.chat_templates import BUILTIN_TEMPLATES, SEP_STYLES, resolve_chat_template
from tests.sglang_conversation import (
    load_conversation_module,
    register_json_template,
    sglang_prompt,
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Why?"},
    ],
    [
        {"role": "user", "content": "  spaced \n"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "B"},
    ],
]


@pytest.fixture(scope="module")
def sglang_conversation():
    return load_conversation_module()


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer(default_model_path)


def render(tokenizer, jinja, messages):
    tokenizer.chat_template = jinja
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_builtin_names_render_as_sglang(sglang_conversation, tokenizer, name):
    chosen = resolve_chat_template(name)
    for messages in CONVERSATIONS:
        assert render(tokenizer, chosen.jinja, messages) == sglang_prompt(
            sglang_conversation, name, messages
        )
    ref = sglang_conversation.chat_templates[name].stop_str
    assert chosen.stop == tuple([ref] if isinstance(ref, str) else ref or ())
    assert (
        chosen.encode_special_tokens
    )  # SGLang encodes a conversation's text with the tokenizer's BOS


# SGLang's JSON file has no sep2: the styles that alternate two separators fail inside SGLang
# itself.
JSON_STYLES = [s for s in SEP_STYLES if s not in ("ADD_COLON_TWO", "NO_COLON_TWO", "LLAMA2")]


@pytest.mark.parametrize("style", JSON_STYLES)
def test_json_conversation_files_render_as_sglang(sglang_conversation, tokenizer, tmp_path, style):
    t = {
        "name": f"mine-{style}",
        "system": "SYSTEM:",
        "system_message": "be kind",
        "user": "<u>",
        "assistant": "<a>",
        "sep_style": style,
        "sep": "\n##",
        "stop_str": ["##", "</end>"],
    }
    path = tmp_path / f"{style}.json"
    path.write_text(json.dumps(t))
    chosen = resolve_chat_template(str(path))
    register_json_template(sglang_conversation, t)
    for messages in CONVERSATIONS:
        assert render(tokenizer, chosen.jinja, messages) == sglang_prompt(
            sglang_conversation, t["name"], messages
        )
    assert chosen.stop == ("##", "</end>")


def test_bad_chat_template_values_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--chat-template 'no-such-template' is neither"):
        resolve_chat_template("no-such-template")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(ValueError, match="--chat-template .*bad.jinja: not a valid Jinja template"):
        resolve_chat_template(str(bad))
    style = tmp_path / "style.json"
    style.write_text(
        json.dumps(
            {
                "name": "x",
                "system": "",
                "user": "U",
                "assistant": "A",
                "sep_style": "RWKV",
                "stop_str": None,
            }
        )
    )
    with pytest.raises(ValueError, match="sep_style RWKV is not supported"):
        resolve_chat_template(str(style))
