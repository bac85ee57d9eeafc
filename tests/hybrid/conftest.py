"""Fixtures of the hybrid-model tests: tiny random checkpoints of each hybrid architecture (HF
transformers' float32 models, the reference: tests/model/hybrid_checkpoints.py), their GGUF files,
built once per run."""

from __future__ import annotations

import pytest

from tests.model.hybrid_checkpoints import ARCHITECTURES, hybrid_checkpoint, tiny_tokenizer

# llama.cpp's names of the architectures tested end to end (HF's: ARCHITECTURES).
HYBRIDS = tuple(ARCHITECTURES)
CONTEXT = 2048  # long enough for the prefix tests' 700-token prompts


@pytest.fixture(scope="session")
def hybrid_checkpoint_dir(tmp_path_factory):
    """arch -> the directory of its tiny checkpoint."""
    tok = tiny_tokenizer()
    built: dict[str, str] = {}

    def get(arch: str) -> str:
        if arch not in built:
            path = str(tmp_path_factory.mktemp(arch))
            built[arch] = hybrid_checkpoint(arch, path, tok, max_position_embeddings=CONTEXT)[0]
        return built[arch]

    return get
