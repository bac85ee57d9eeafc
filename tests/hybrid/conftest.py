"""Fixtures of the hybrid-model tests: tiny random checkpoints of each hybrid architecture (HF
transformers' float32 models, the reference: tests/model/hybrid_checkpoints.py), their GGUF files,
built once per run."""

from __future__ import annotations

import pytest

from tests.hybrid import kimi_linear_checkpoint
from tests.model.hybrid_checkpoints import ARCHITECTURES, hybrid_checkpoint, tiny_tokenizer

# llama.cpp's names of the architectures tested end to end (HF's: ARCHITECTURES).
HYBRIDS = tuple(ARCHITECTURES)
# ... and through the Engine's prefix cache (test_hybrid_engine.py): Kimi-Linear too
# (kimi_linear_checkpoint.py; its GGUF is tested in test_kimi_linear.py).
ENGINE_HYBRIDS = (*HYBRIDS, kimi_linear_checkpoint.ARCH)
CONTEXT = 2048  # long enough for the prefix tests' 700-token prompts


@pytest.fixture(scope="session")
def hybrid_checkpoint_dir(tmp_path_factory):
    """arch -> the directory of its tiny checkpoint."""
    tok = tiny_tokenizer()
    built: dict[str, str] = {}

    def get(arch: str) -> str:
        if arch not in built:
            path = str(tmp_path_factory.mktemp(arch))
            build = (
                kimi_linear_checkpoint.checkpoint
                if arch == kimi_linear_checkpoint.ARCH
                else lambda *a, **kw: hybrid_checkpoint(arch, *a, **kw)
            )
            built[arch] = build(path, tok, max_position_embeddings=CONTEXT)[0]
        return built[arch]

    return get
