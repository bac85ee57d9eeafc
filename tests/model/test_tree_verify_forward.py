"""A TARGET_VERIFY forward of draft trees (model/tree_mask.py: each node at its prefix + depth,
attending its prefix and ancestors) gives every node the logits transformers gives the sequence
prompt + root + the node's path: tiny Llama on the torch and native backends, tiny DeepSeek-V2 on
the MLA backend, several requests with trees and a chain beside them."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.layers.attention import NativeCPUBackend, TorchSDPABackend
from radixlm.model.loader import load_model
from tests.model.deepseek_refs import MLAHarness, make_hf
from tests.model.helpers import SMALL, PoolHarness, check_trees, save_random_llama

ATOL = 1e-4  # as tests/model/test_logits.py


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tree-llama")
    hf, _ = save_random_llama(path)
    return hf, load_model(str(path))


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_llama_tree_verify_rows_equal_transformers(llama, backend, native_kernels_built):
    assert backend == "torch" or native_kernels_built, "the native kernels failed to build"
    hf, loaded = llama
    h = PoolHarness(
        loaded.model,
        loaded.hf_config,
        attn_backend=TorchSDPABackend() if backend == "torch" else NativeCPUBackend(),
    )
    check_trees(h, hf, SMALL["vocab_size"], seed=3)


def test_deepseek_mla_tree_verify_rows_equal_transformers(tmp_path):
    hf, cfg = make_hf("v2")
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    check_trees(MLAHarness(loaded.model, loaded.hf_config), hf, cfg.vocab_size, seed=4)
