"""The served model as Ollama's API names and describes it: which `model` names a request may use
(resolve_model, the one place to swap for multi-model serving), and the entries of /api/tags,
/api/ps and /api/show.

Ollama names models `name:tag` with the tag defaulting to "latest"; the served model is listed as
its served name (--served-model-name, else the model's path) with ":latest", and a request may
name it with or without the tag, or by the model's path or directory name, as /v1/models' checks
accept (model_names.known_model_names). A loaded LoRA adapter is a model of its own name. Anything
else is Ollama's 404 "model 'x' not found" (vLLM's strict check, not SGLang's any-name default: an
Ollama client picks models from /api/tags and expects a wrong name to fail).
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime, timedelta

from radixlm.server.api_common import HTTPError, ServerState, served_model_name
from radixlm.server.fim import fim_tokens
from radixlm.server.model_names import known_model_names
from radixlm.server.tool_template import tool_setup

LATEST = ":latest"


def resolve_model(state: ServerState, name: str) -> str:
    """The model (or LoRA adapter) name the OpenAI pipelines take for the Ollama `model`; a 404 in
    Ollama's words when the server does not serve it."""
    known = known_model_names(state)
    adapters = state.tokenizer_manager.lora.adapter_names()
    for candidate in (name, name.removesuffix(LATEST)):
        if candidate in known:
            return served_model_name(state.server_args, state.scheduler_info)
        if candidate in adapters:
            return candidate
    raise HTTPError(404, f"model '{name}' not found", "not_found_error", "model")


def tag(name: str) -> str:
    """Ollama's full name: a tag added when the name has none."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def _family(state: ServerState) -> str:
    arch = state.scheduler_info["architecture"]
    for suffix in ("ForCausalLM", "ForConditionalGeneration", "Model"):
        arch = arch.removesuffix(suffix)
    return arch.lower()


def _size(path: str) -> int:
    """The weights' bytes on disk (a file, or a directory's files)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def details(state: ServerState) -> dict:
    path = state.scheduler_info["model_path"]
    family = _family(state)
    return {
        "parent_model": "",
        "format": "gguf" if path.endswith(".gguf") else "safetensors",
        "family": family,
        "families": [family],
        "parameter_size": "",  # not known without reading the weights again
        "quantization_level": "",
    }


def _started(state: ServerState) -> str:
    return datetime.fromtimestamp(state.started_at, UTC).isoformat()


def _entries(state: ServerState) -> list[tuple[str, str]]:
    """(Ollama name, the digest's source) of the base model and each loaded LoRA adapter."""
    base = served_model_name(state.server_args, state.scheduler_info)
    names = [(tag(base), state.scheduler_info["model_path"])]
    return names + [
        (tag(a), f"{base}:{a}") for a in sorted(state.tokenizer_manager.lora.adapter_names())
    ]


def tags(state: ServerState) -> dict:
    """/api/tags: the served model (and its adapters) as local models."""
    size = _size(state.scheduler_info["model_path"])
    return {
        "models": [
            {
                "name": name,
                "model": name,
                "modified_at": _started(state),
                "size": size,
                "digest": hashlib.sha256(source.encode()).hexdigest(),
                "details": details(state),
            }
            for name, source in _entries(state)
        ]
    }


def running(state: ServerState) -> dict:
    """/api/ps: the same models, loaded until the server stops (Ollama's keep_alive -1 shows its
    largest expiry, about 292 years on; so does this)."""
    forever = (datetime.now(UTC) + timedelta(microseconds=2**63 // 1000)).isoformat()
    size = _size(state.scheduler_info["model_path"])
    models = []
    for entry in tags(state)["models"]:
        entry = {k: v for k, v in entry.items() if k != "modified_at"}
        models.append(
            {
                **entry,
                "expires_at": forever,
                "size_vram": size + state.scheduler_info["kv_cache_bytes"],
                "context_length": state.context_len,
            }
        )
    return {"models": models}


def capabilities(state: ServerState) -> list[str]:
    """Ollama's names for what the model does here."""
    info, args = state.scheduler_info, state.server_args
    if info.get("is_embedding"):
        return ["embedding"]
    tok = state.tokenizer_manager.tokenizer
    caps = ["completion"]
    if tool_setup(tok, args.tool_call_parser).parser is not None:
        caps.append("tools")
    try:
        if fim_tokens(tok, args.completion_template) is not None:
            caps.append("insert")
    except ValueError:  # --completion-template names tokens the vocabulary lacks
        pass
    if "image" in info.get("modalities", ["text"]):
        caps.append("vision")
    if args.reasoning_parser is not None:
        caps.append("thinking")
    return caps


def show(state: ServerState, name: str) -> dict:
    """/api/show: details, the chat template (Jinja: radixlm renders HF templates, not Go ones),
    the model's key numbers under Ollama's model_info keys, capabilities."""
    info = state.scheduler_info
    family = _family(state)
    template = state.tokenizer_manager.tokenizer.chat_template
    return {
        "modelfile": f"# served by radixlm\nFROM {info['model_path']}\n",
        "parameters": "",
        "template": template if isinstance(template, str) else "",
        "details": details(state),
        "model_info": {
            "general.architecture": family,
            "general.basename": os.path.basename(info["model_path"].rstrip("/")),
            f"{family}.context_length": state.context_len,
            f"{family}.embedding_length": info.get("hidden_size"),
            f"{family}.vocab_size": info["vocab_size"],
        },
        "capabilities": capabilities(state),
        "modified_at": _started(state),
    }
