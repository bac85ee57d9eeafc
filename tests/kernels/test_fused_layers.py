"""The one-op decoder stack (model/layers/fused_layers.py) against the Python layers it replaces:
bitwise the same logits, prefill and decode, every KV dtype it is used with."""

import pytest
import torch

from radixlm.model.layers.attention import NativeCPUBackend
from radixlm.model.layers.fused_layers import GELU_TANH, QK_NORM, SANDWICH
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


@pytest.mark.parametrize("feature", ["attention_chunk_size", "sinks", "logit_cap"])
def test_fused_layers_leave_chunks_sinks_and_mixed_caps_to_layers(kernel_ops, tmp_path, feature):
    """The op's attention has no attention chunks or sinks, and one soft-cap for all layers: a
    model with a layer outside that runs its Python layers (whose native attention takes them
    per call)."""
    from tests.model.test_gguf_mixed_quants import _mixed_model

    path, _ = _mixed_model(tmp_path)
    stack = load_model(path).model.model
    assert stack.fused_layers()
    attn = stack.layers[-1].self_attn.attn
    value = {"attention_chunk_size": 8, "logit_cap": 30.0}.get(feature)
    setattr(attn, feature, value if value else torch.nn.Parameter(torch.zeros(attn.num_heads)))
    stack._fused = None
    assert not stack.fused_layers()


TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
)
WINDOW = 8
# family: (transformers config class, its fields, the op's flags, the windowed layers)
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(num_hidden_layers=2), QK_NORM, []),
    "gemma2": (
        "Gemma2Config",
        dict(
            num_hidden_layers=4,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "full_attention"] * 2,
        ),
        SANDWICH | GELU_TANH,
        [0, 2],
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_hidden_layers=6,
            query_pre_attn_scalar=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        ),
        QK_NORM | SANDWICH | GELU_TANH,
        [0, 1, 2, 3, 4],
    ),
}
CASES = [
    ("qwen3", "one-space"),
    ("gemma2", "one-space"),
    ("gemma2", "swa-pool"),
    ("gemma3", "one-space"),
    ("gemma3", "swa-pool"),
]


@pytest.fixture(scope="module")
def q8_models(tmp_path_factory):
    """Each family's tiny random checkpoint (every weight drawn), loaded quantized to Q8_0."""
    import transformers

    from tests.model.helpers import randomize

    loaded = {}
    for family, (config_cls, fields, _, _) in FAMILIES.items():
        config = getattr(transformers, config_cls)(**TINY, **fields)
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        randomize(hf)
        path = tmp_path_factory.mktemp(family)
        hf.eval().save_pretrained(path)
        loaded[family] = load_model(str(path), quantization="q8_0")
    return loaded


@pytest.mark.parametrize("family,pool", CASES)
def test_fused_layers_of_other_families_equal_their_python_layers(
    kernel_ops, q8_models, family, pool
):
    """Qwen3's q/k norms; Gemma 2's sandwich norms, GELU MLP, attention soft-cap and windows every
    other layer; Gemma 3's q/k norms and a RoPE table per layer kind: the one-op stack gives their
    Python layers' logits bitwise, prompts past the window, with the windowed layers' KV in the
    pool's one slot space or in a space of their own."""
    _, _, flags, swa_layers = FAMILIES[family]
    loaded = q8_models[family]
    stack = loaded.model.model
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (29, 6)]
    runs = []
    for fused in (True, False):
        stack.use_fused_layers, stack._fused = fused, None
        h = PoolHarness(
            loaded.model,
            loaded.hf_config,
            attn_backend=NativeCPUBackend(),
            swa_layers=swa_layers if pool == "swa-pool" else None,
        )
        a, b = h.new_request(), h.new_request()
        steps = [h.extend([a, b], prompts)]
        for t in range(WINDOW + 2):  # decode past a window's end
            steps.append([h.decode([a, b], [7 + t, 40 + t])])
        if fused:
            assert stack._fused and stack._fused.flags == flags
            assert [w > 0 for w in stack._fused.windows] == [
                i in swa_layers for i in range(len(stack.layers))
            ]
        runs.append([x for step in steps for x in step])
    stack.use_fused_layers = True
    assert all(torch.equal(x, y) for x, y in zip(*runs))
