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
        h = PoolHarness(
            model, default_model.hf_config, attn_backend=NativeCPUBackend(), kv_dtype=kv_dtype
        )
        a, b = h.new_request(), h.new_request()
        ext = h.extend([a, b], prompts)
        dec = h.decode([a, b], [7, 9])
        runs.append((ext, dec))
    model.model.use_fused_layers = True
    assert model.model._fused, "the default model should take the fused path"
    (e1, d1), (e2, d2) = runs
    assert all(torch.equal(x, y) for x, y in zip(e1, e2)) and torch.equal(d1, d2)


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["no-bias", "qkv-bias"])
def test_fused_layers_take_mixed_format_projections(kernel_ops, tmp_path, qkv_bias):
    """A Q4_K_M-style file: qkv of Q4_K q/k beside a Q6_K (or Q5_0) v runs in the op as two
    segments, bitwise the Python layers' result (with a qkv bias, as Qwen2 has)."""
    from tests.model.test_gguf_mixed_quants import _mixed_model

    torch.set_num_threads(2)
    path, _ = _mixed_model(tmp_path)
    loaded = load_model(path)
    model = loaded.model
    assert model.model.layers[0].self_attn.qkv_proj.qweight.formats == ["q4_kx8", "q6_kx8"]
    if qkv_bias:
        g = torch.Generator().manual_seed(5)
        for layer in model.model.layers:
            qkv = layer.self_attn.qkv_proj
            qkv.bias = torch.nn.Parameter(0.2 * torch.randn(qkv.out_features, generator=g))
    g = torch.Generator().manual_seed(12)
    prompts = [
        torch.randint(0, loaded.hf_config.vocab_size, (n,), generator=g).tolist() for n in (29, 4)
    ]
    runs = []
    for fused in (True, False):
        model.model.use_fused_layers, model.model._fused = fused, None
        h = PoolHarness(
            model, loaded.hf_config, attn_backend=NativeCPUBackend(), kv_dtype=torch.float16
        )
        a, b = h.new_request(), h.new_request()
        runs.append((h.extend([a, b], prompts), h.decode([a, b], [3, 8])))
        if fused:
            assert model.model._fused and model.model._fused.seg_counts[:4] == [2, 1, 1, 1]
    (e1, d1), (e2, d2) = runs
    assert all(torch.equal(x, y) for x, y in zip(e1, e2)) and torch.equal(d1, d2)


@pytest.mark.parametrize("feature", ["sliding_window_size", "logit_cap", "sinks"])
def test_fused_layers_leave_windows_caps_and_sinks_to_the_layers(kernel_ops, tmp_path, feature):
    """The op's attention has none of the three: a model with any layer using one runs its Python
    layers (whose native attention takes them per call)."""
    from tests.model.test_gguf_mixed_quants import _mixed_model

    path, _ = _mixed_model(tmp_path)
    stack = load_model(path).model.model
    assert stack.fused_layers()
    attn = stack.layers[-1].self_attn.attn
    value = {"sliding_window_size": 8, "logit_cap": 30.0}.get(feature)
    setattr(attn, feature, value if value else torch.nn.Parameter(torch.zeros(attn.num_heads)))
    stack._fused = None
    assert not stack.fused_layers()
