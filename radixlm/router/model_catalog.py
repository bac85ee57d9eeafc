"""The models a multi-model server offers (`serve --model-path A --model-path B`, `--models-dir
DIR`): each one's name (a GGUF file's stem, a HF directory's name, a hub id's last part, as
llama-server's router names them), its path, and what the listings show of it (size, date,
format, family). Nothing is loaded here."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str  # a GGUF file, a HF directory, or a hub id (the child server resolves it)
    size: int = 0  # bytes on disk; 0 for a hub id not downloaded here
    modified: float = 0.0  # the file's (or directory's) mtime, seconds since the epoch

    @property
    def format(self) -> str:
        return "gguf" if self.path.endswith(".gguf") else "safetensors"

    @property
    def family(self) -> str:
        """A HF directory's model_type (config.json); "" when unknown (GGUF, hub id)."""
        try:
            with open(os.path.join(self.path, "config.json")) as f:
                return str(json.load(f).get("model_type", ""))
        except (OSError, ValueError):
            return ""

    @property
    def digest(self) -> str:
        """Ollama's listings carry a digest: here the sha256 of what identifies this version of
        the files (path, size, date), not of their bytes (hashing gigabytes to list models)."""
        key = f"{os.path.abspath(self.path)}\0{self.size}\0{self.modified}"
        return hashlib.sha256(key.encode()).hexdigest()

    @property
    def modified_at(self) -> str:
        return datetime.datetime.fromtimestamp(self.modified, datetime.UTC).isoformat()


_SPLIT_PART = re.compile(r"-(\d{5})-of-\d{5}$")  # llama.cpp's gguf-split part names


def model_name(path: str) -> str:
    base = os.path.basename(os.path.normpath(path))
    return _SPLIT_PART.sub("", base.removesuffix(".gguf")) if base.endswith(".gguf") else base


def _is_model_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json"))


def _disk_size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def spec_of(path: str) -> ModelSpec:
    if not os.path.exists(path):  # a hub id: the child downloads or finds it in the cache
        return ModelSpec(model_name(path), path)
    return ModelSpec(model_name(path), path, _disk_size(path), os.path.getmtime(path))


def models_in_dir(models_dir: str) -> list[str]:
    """Every GGUF file and HF model directory (one with a config.json) directly in models_dir,
    sorted by name. A GGUF split in parts (name-00001-of-00003.gguf) is one model: its first
    part."""
    if not os.path.isdir(models_dir):
        raise ValueError(f"models_dir: {models_dir!r} is not a directory")
    found = []
    for entry in sorted(os.listdir(models_dir)):
        path = os.path.join(models_dir, entry)
        if entry.endswith(".gguf") and os.path.isfile(path):
            part = _SPLIT_PART.search(entry.removesuffix(".gguf"))
            if part and part.group(1) != "00001":
                continue
            found.append(path)
        elif os.path.isdir(path) and _is_model_dir(path):
            found.append(path)
    return found


def catalog(model_paths: list[str], models_dir: str | None) -> dict[str, ModelSpec]:
    """name -> spec for the given paths, then the directory's models; a ValueError when two
    share a name or there is none."""
    paths = list(model_paths) + (models_in_dir(models_dir) if models_dir else [])
    specs: dict[str, ModelSpec] = {}
    for path in paths:
        spec = spec_of(path)
        if spec.name in specs:
            raise ValueError(
                f"model_path: two models are named {spec.name!r} ({specs[spec.name].path} and"
                f" {path}); each model's name is its file stem or directory name"
            )
        specs[spec.name] = spec
    if not specs:
        raise ValueError(f"models_dir: no GGUF file or HF model directory in {models_dir!r}")
    return specs
