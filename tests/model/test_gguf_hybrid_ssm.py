"""llama.cpp's hybrid architectures nemotron_h, lfm2 and lfm2moe read back into HF's config and
tensors:
tiny random HF checkpoints written as GGUF the way llama.cpp's converter writes them
(tests/model/ssm_gguf_writer.py: Nemotron-H's A_log as -exp [H, 1], D [H, 1], dt_bias renamed,
conv1d squeezed, the grouped norm reshaped [groups, width], q/k rows permuted for llama's RoPE, the
layer pattern only in per-layer head_count_kv / feed_forward_length; LFM2's conv squeezed and its
MLP width written adjusted; LFM2-MoE's experts stacked, its expert_bias as exp_probs_b) must load
(gguf_config + gguf_weights) as exactly HF's config fields and tensors; Q8_0 files within Q8_0's
error, their matrices kept as stored blocks (the experts' too), the routers float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlm.kernels.formats import dequantize_reference
from radixlm.model.gguf.loader import gguf_config, gguf_weights
from radixlm.model.gguf.reader import open_gguf
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.models.lfm2 import lfm2_ff_dim
from tests.model.hybrid_checkpoints import (
    ARCHITECTURES,
    expected_weights,
    hf_model,
    save_tokenizer,
    tiny_tokenizer,
    write_gguf,
)

ARCHS = ["nemotron_h", "lfm2", "lfm2moe"]
_SHARED_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "layer_types",
    "vocab_size",
    "tie_word_embeddings",
    "eos_token_id",
)
_FIELDS = {
    "nemotron_h": (
        "head_dim",
        "intermediate_size",
        "mamba_num_heads",
        "mamba_head_dim",
        "n_groups",
        "ssm_state_size",
        "conv_kernel",
        "use_conv_bias",
        "use_bias",
        "mlp_bias",
        "time_step_min",
    ),
    "lfm2": ("conv_L_cache", "conv_bias", "max_position_embeddings"),
    "lfm2moe": (
        "conv_L_cache",
        "conv_bias",
        "max_position_embeddings",
        "intermediate_size",
        "moe_intermediate_size",
        "num_dense_layers",
        "num_experts",
        "num_experts_per_tok",
        "use_expert_bias",
        "norm_topk_prob",
        "routed_scaling_factor",
    ),
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_tokenizer(str(tmp_path_factory.mktemp("ssm-tokenizer")), tiny_tokenizer())


@pytest.fixture(scope="module")
def models(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return {arch: hf_model(arch, tok) for arch in ARCHS}


def _load(path: str, keep_quantized: bool = False):
    reader = open_gguf(path)
    config = gguf_config(reader)
    weights = list(gguf_weights(reader, config, keep_quantized=keep_quantized))
    names = [n for n, _ in weights]
    assert len(names) == len(set(names)), "a tensor yielded twice"
    return config, dict(weights)


def _float(w) -> torch.Tensor:
    if isinstance(w, ExpertWeights):
        return w.dequantize()
    if isinstance(w, QuantizedTensor):
        return dequantize_reference(w.data, w.fmt.name, w.cols).reshape(-1, w.cols).float()
    return w


def _q8_tolerance(ref: torch.Tensor) -> torch.Tensor:
    """Q8_0's bound per row: half a step (block max / 127) plus the f16 scale's rounding."""
    return ref.abs().amax(-1, keepdim=True) / 127 * 1.01 + 1e-6


@pytest.mark.parametrize("arch", ARCHS)
def test_config_matches_hf(arch, models, tokenizer_dir, tmp_path):
    hf = models[arch]
    config, _ = _load(write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf")))
    ref = hf.config
    assert config.architectures == [ARCHITECTURES[arch]]
    assert type(config) is type(ref)
    for key in _SHARED_FIELDS + _FIELDS[arch]:
        assert getattr(config, key) == getattr(ref, key), key
    if arch == "nemotron_h":
        assert config.num_hidden_layers == ref.num_hidden_layers == 6
        assert config.hybrid_override_pattern == ref.hybrid_override_pattern == "M-*M-M"
        assert config.layer_norm_epsilon == pytest.approx(ref.layer_norm_epsilon)
        assert config.max_position_embeddings == 2**20  # GraniteHybridModel's, without RoPE
    else:
        if arch == "lfm2":
            assert lfm2_ff_dim(config) == lfm2_ff_dim(ref) == 96
        assert config.norm_eps == pytest.approx(ref.norm_eps)
        for key in ("rope_type", "rope_theta"):
            assert config.rope_parameters[key] == ref.rope_parameters[key], key


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("keep_quantized", [False, True], ids=["float", "keep"])
def test_weights_equal_hf(arch, keep_quantized, models, tokenizer_dir, tmp_path):
    """Every HF tensor comes back bit for bit; A_log as the float32 whose -exp is the file's
    ssm_a (-exp is not injective in float32: that is the most the file holds)."""
    hf = models[arch]
    _, got = _load(write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf")), keep_quantized)
    want = expected_weights(hf)
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        w = _float(got[name])
        assert w.dtype == torch.float32 and w.shape == ref.shape, name
        if name.endswith("A_log"):
            assert torch.equal(-torch.exp(w), -torch.exp(ref)), name
            torch.testing.assert_close(w, ref, rtol=0, atol=1e-6)
            continue
        assert torch.equal(w, ref), f"{name}: max |diff| {(w - ref).abs().max().item():.3g}"


@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_within_quantization_error(arch, models, tokenizer_dir, tmp_path):
    """Matrices Q8_0 (q/k rows un-permuted as whole quantized rows), conv weights and the small
    Mamba-2 tensors float32 as the converter stores them."""
    hf = models[arch]
    path = write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf"), qtype="q8_0")
    want = expected_weights(hf)
    _, floats = _load(path)
    _, kept = _load(path, keep_quantized=True)
    assert sorted(floats) == sorted(want) == sorted(kept)
    for name, ref in want.items():
        w, q = floats[name], _float(kept[name])
        assert w.shape == ref.shape == q.shape, name
        assert ((w - ref).abs() <= _q8_tolerance(ref)).all(), name
        assert torch.equal(q, w), name  # the kept blocks are the file's, moved whole
        if name.endswith("feed_forward.gate.weight"):  # the router: float32, as the converter
            assert not isinstance(kept[name], QuantizedTensor), name
            assert torch.equal(w, ref), name
        elif ref.dim() == 2 or ".experts." in name:  # every matrix, the experts' stacks too:
            # Q8_0 blocks as stored
            assert isinstance(kept[name], QuantizedTensor | ExpertWeights), name
            assert kept[name].fmt.name == "q8_0", name
        else:  # norms, biases, conv weights, A_log, D: float32
            assert not isinstance(kept[name], QuantizedTensor), name
    conv = "mixer.conv1d" if arch == "nemotron_h" else "conv.conv"
    layer = f"model.layers.0.{conv}.weight"
    assert torch.equal(kept[layer], want[layer])  # the converter stores conv weights F32


_BAD_SHAPES = [
    ("nemotron_h", "blk.0.ssm_conv1d.weight", (120, 4)),
    ("nemotron_h", "blk.3.ssm_a", (7, 1)),
    ("nemotron_h", "blk.5.ssm_norm.weight", (4, 16)),
    ("nemotron_h", "blk.0.ssm_in.weight", (199, 64)),
    ("lfm2", "blk.2.shortconv.conv.weight", (64, 4)),
    ("lfm2", "blk.0.shortconv.in_proj.weight", (128, 64)),
    ("lfm2moe", "blk.3.shortconv.conv.weight", (64, 4)),
]


@pytest.mark.parametrize("arch, tensor, shape", _BAD_SHAPES)
def test_mismatched_state_shapes_named(arch, tensor, shape, models, tokenizer_dir, tmp_path):
    bad = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if tensor.endswith("ssm_a"):
        bad = -np.abs(bad)
    path = write_gguf(
        models[arch], tokenizer_dir, str(tmp_path / "m.gguf"), overrides={tensor: bad}
    )
    with pytest.raises(ValueError, match=rf"{tensor}.*shape"):
        _load(path)
