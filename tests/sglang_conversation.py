"""SGLang's own chat rendering as a test reference: sglang/srt/parser/conversation.py from the
installed wheel (a test dependency), with its two imports of the GPU server stubbed (neither is
used by Conversation.get_prompt; sglang.srt itself needs triton)."""

import importlib.util
import os
import sys
import types
from types import SimpleNamespace


def load_conversation_module():
    spec = importlib.util.find_spec("sglang")
    path = os.path.join(spec.submodule_search_locations[0], "srt", "parser", "conversation.py")
    stubs = {
        "sglang.srt.entrypoints.openai.protocol": types.SimpleNamespace(
            ChatCompletionRequest=object
        ),
        "sglang.srt.utils": types.SimpleNamespace(
            ImageData=object, read_system_prompt_from_file=lambda *a: ""
        ),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        loader = importlib.util.spec_from_file_location("sglang_conversation_reference", path)
        module = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k)
            else:
                sys.modules[k] = v
    return module


def register_json_template(module, t: dict) -> None:
    """A JSON conversation file's template, registered as SGLang's template_manager does."""
    module.register_conv_template(
        module.Conversation(
            name=t["name"],
            system_template=t["system"] + "\n{system_message}",
            system_message=t.get("system_message", ""),
            roles=(t["user"], t["assistant"]),
            sep_style=module.SeparatorStyle[t["sep_style"]],
            sep=t.get("sep", "\n"),
            stop_str=t["stop_str"],
        ),
        override=True,
    )


def sglang_prompt(module, name: str, messages: list[dict]) -> str:
    """What SGLang's chat route renders for `messages` with the conversation template `name`."""
    request = SimpleNamespace(messages=[SimpleNamespace(**m) for m in messages])
    return module.generate_chat_conv(request, name).get_prompt()
