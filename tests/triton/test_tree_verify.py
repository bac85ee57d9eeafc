"""A TARGET_VERIFY batch of draft trees (model/tree_mask.py) through TritonAttnBackend: its tree
mask reaches the extend kernel as custom_mask / mask_start, and every node's logits equal
transformers' for the node's path (tiny Llama, several requests, a chain beside the trees). A model
with a sliding window drafts chains on this backend."""

from __future__ import annotations

import torch

from radixlm.model.layers.attention import AttentionBackendSpec
from radixlm.model.layers.attention.triton_backend import TritonAttnBackend
from radixlm.model.loader import load_model
from tests.model.helpers import SMALL, PoolHarness, check_trees, save_random_llama
from tests.triton.conftest import requires_triton

pytestmark = requires_triton


def test_triton_tree_verify_rows_equal_transformers(triton_device, tmp_path):
    hf, config = save_random_llama(tmp_path)
    model = load_model(str(tmp_path), device=str(triton_device)).model
    spec = AttentionBackendSpec(
        head_dim=16, dtype=torch.float32, kv_dtype=torch.float32, device=triton_device
    )
    backend = TritonAttnBackend(spec)
    assert backend.supports_tree_mask
    check_trees(
        PoolHarness(model, config, attn_backend=backend, device=triton_device),
        hf,
        SMALL["vocab_size"],
        seed=5,
    )
    windowed = AttentionBackendSpec(
        head_dim=16,
        dtype=torch.float32,
        kv_dtype=torch.float32,
        device=triton_device,
        sliding_window_size=8,
    )
    assert not TritonAttnBackend(windowed).supports_tree_mask
