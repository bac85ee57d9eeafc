"""The text a request is routed on: what a worker's radix cache will hold a prefix of.

Native /generate: `text` (the first, for a batch) or `input_ids` spelled "id," per token (so one
id list is a character prefix of another exactly when it is a token prefix). OpenAI completions:
`prompt`. Chat: the whole conversation rendered role by role, not its first message: turns of
one conversation then share the prefix their own history makes, as they do in the worker's cache
after its chat template.

A request with a `cache_salt` shares cached KV only with requests of the same salt (the worker
keeps them in a namespace of their own), so its text starts with a mark of the salt: requests of
one salt gather on the worker that holds their prefixes, and a prefix another salt made does not
attract them where it would not be reused.
"""

from __future__ import annotations

import hashlib
from typing import Any


def _ids_text(ids: list) -> str:
    return "".join(f"{i}," for i in ids)


def _prompt_text(p: Any) -> str:
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p:
        if all(isinstance(x, int) for x in p):
            return _ids_text(p)
        return _prompt_text(p[0])  # a batch goes to one worker: route it on its first prompt
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _input_text(inp: Any) -> str:
    """Responses' and embeddings' `input`: a string, ids, a batch, or (Responses) a list of
    items."""
    if isinstance(inp, list) and inp and isinstance(inp[0], dict):
        return "".join(_content_text(item.get("content")) for item in inp if isinstance(item, dict))
    return _prompt_text(inp)


def routing_text(path: str, body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    salt = body.get("cache_salt")
    if isinstance(salt, list) and salt:
        salt = salt[0]  # a batch is routed on its first item
    text = _text(path, body)
    if isinstance(salt, str) and salt:
        return f"\0salt {hashlib.sha256(salt.encode()).hexdigest()[:16]}\0{text}"
    return text


def _text(path: str, body: dict) -> str:
    if path.endswith("/chat/completions") or path.startswith("/v1/messages"):
        msgs = body.get("messages")
        if not isinstance(msgs, list):
            return ""
        system = body.get("system")  # Anthropic's Messages API keeps it out of the messages
        head = f"<|system|>{_content_text(system)}\n" if system else ""
        return head + "".join(
            f"<|{m.get('role', '')}|>{_content_text(m.get('content'))}\n"
            for m in msgs
            if isinstance(m, dict)
        )
    if path in ("/v1/responses", "/v1/embeddings"):
        return _input_text(body.get("input"))
    if path.endswith("/completions"):
        return _prompt_text(body.get("prompt"))
    if body.get("text") is not None:
        return _prompt_text(body["text"])
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        return _prompt_text(ids[0] if ids and isinstance(ids[0], list) else ids)
    return ""


def _ids(p: Any) -> list[int] | None:
    if isinstance(p, list) and p and isinstance(p[0], list):
        p = p[0]  # a batch: its first prompt, as for the text
    if isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        return p
    return None


def routing_tokens(path: str, body: Any) -> list[int] | None:
    """The token ids a worker will cache for the request when the body gives them (native
    `input_ids`, a completions `prompt` of ids); None otherwise, and for a request in a cache
    namespace of its own (a `cache_salt`, a LoRA adapter): its blocks hash from the namespace,
    which the router cannot spell."""
    if not isinstance(body, dict) or body.get("cache_salt") or body.get("lora_path"):
        return None
    if path == "/generate":
        return _ids(body.get("input_ids"))
    if path == "/v1/completions":
        return _ids(body.get("prompt"))
    return None


def tokenizable_text(path: str, body: Any) -> str | None:
    """The prompt text a worker's /tokenize turns into the ids it caches (native `text`, a
    completions `prompt` string); None where the worker renders more around it (chat templates)
    or the request is in a namespace of its own."""
    if not isinstance(body, dict) or body.get("cache_salt") or body.get("lora_path"):
        return None
    p = body.get("text") if path == "/generate" else body.get("prompt")
    if path not in ("/generate", "/v1/completions"):
        return None
    if isinstance(p, list) and p and isinstance(p[0], str):
        p = p[0]
    return p if isinstance(p, str) and p else None
