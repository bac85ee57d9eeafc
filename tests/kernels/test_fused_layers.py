"""The one-op decoder stack (model/layers/fused_layers.py) against the Python layers it replaces:
bitwise the same logits, prefill and decode, every KV dtype it is used with."""

import pytest
import torch

from radixlm.model.layers.attention import NativeCPUBackend
from radixlm.model.loader import load_model
from tests.model.helpers import PoolHarness


@pytest.fixture(scope="module")
def default_model():
    torch.set_num_threads(2)
    return load_model(None)  # the GGUF's own Q4_1 / Q8_0


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.int8], ids=str)
def test_fused_layers_equal_python_layers(kernel_ops, default_model, kv_dtype):
    model = default_model.model
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(100, 40000, (n,), generator=g).tolist() for n in (33, 5)]
    runs = []
    for fused in (True, False):
        model.model.use_fused_layers = fused
        h = PoolHarness(model, default_model.hf_config, attn_backend=NativeCPUBackend(), kv_dtype=kv_dtype)
        a, b = h.new_request(), h.new_request()
        ext = h.extend([a, b], prompts)
        dec = h.decode([a, b], [7, 9])
        runs.append((ext, dec))
    model.model.use_fused_layers = True
    assert model.model._fused, "the default model should take the fused path"
    (e1, d1), (e2, d2) = runs
    assert all(torch.equal(x, y) for x, y in zip(e1, e2)) and torch.equal(d1, d2)
