"""llama.cpp's hybrid architectures qwen35, qwen35moe and qwen3next read back into HF's config and
tensors: tiny random HF checkpoints written as GGUF the way llama.cpp's converter writes them
(tests/model/hybrid_checkpoints.py: V heads tiled, qkvz split, A_log as -exp, norms + 1, conv1d
squeezed) must load (gguf_config + gguf_weights) as exactly HF's config fields and tensors, but
for qwen35/qwen35moe's V heads, kept in the file's tiled order (config.linear_value_heads_tiled);
Q8_0 files within Q8_0's error, their quantized blocks kept as stored."""

from __future__ import annotations

import logging

import gguf
import numpy as np
import pytest
import torch

from radixlm.kernels.formats import dequantize_reference
from radixlm.model.gguf.archs import qwen35 as gguf_qwen35
from radixlm.model.gguf.loader import gguf_config, gguf_weights
from radixlm.model.gguf.reader import open_gguf
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.tp_shard import TensorSlice
from tests.model.hybrid_checkpoints import (
    ARCHITECTURES,
    expected_weights,
    hf_model,
    save_tokenizer,
    tiny_tokenizer,
    write_gguf,
)

ARCHS = ["qwen35", "qwen35moe", "qwen3next"]  # nemotron_h, lfm2: test_gguf_hybrid_ssm.py
_CONFIG_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "layer_types",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eos_token_id",
)
_MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


@pytest.fixture(autouse=True)
def warnings_once_per_test(monkeypatch):
    """The loader warns once per process and kind; each test here looks for its own warning."""
    monkeypatch.setattr(gguf_qwen35, "_warned", set())


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return save_tokenizer(str(tmp_path_factory.mktemp("qwen-tokenizer")), tiny_tokenizer())


@pytest.fixture(scope="module")
def models(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return {arch: hf_model(arch, tok) for arch in ARCHS}


def _load(path: str, keep_quantized: bool = False, slicer=None):
    reader = open_gguf(path)
    config = gguf_config(reader)
    weights = list(gguf_weights(reader, config, keep_quantized=keep_quantized, slicer=slicer))
    names = [n for n, _ in weights]
    assert len(names) == len(set(names)), "a tensor yielded twice"
    return config, dict(weights)


def _file_order(arch: str, hf, want: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """want (HF's tensors) with qwen35/qwen35moe's V heads in llama.cpp's tiled order, where the
    loader keeps them: tiled position p holds HF's (grouped) value head (p % nk) * r + p // nk,
    so value head p reads key head p % nk."""
    c = hf.config
    nk, nv, hk, hv = (
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
    )
    if arch == "qwen3next" or nk == nv:
        return want
    r, qk = nv // nk, 2 * nk * hk
    heads = [(p % nk) * r + p // nk for p in range(nv)]

    def idx(width: int, offset: int = 0) -> torch.Tensor:
        keep = torch.arange(offset)
        return torch.cat([keep] + [offset + h * width + torch.arange(width) for h in heads])

    out = dict(want)
    for name, t in want.items():
        if ".linear_attn." not in name:
            continue
        if name.endswith((".in_proj_qkv.weight", ".conv1d.weight")):
            out[name] = t[idx(hv, qk)]
        elif name.endswith(".in_proj_z.weight"):
            out[name] = t[idx(hv)]
        elif name.endswith((".in_proj_a.weight", ".in_proj_b.weight", ".A_log", ".dt_bias")):
            out[name] = t[idx(1)]
        elif name.endswith(".out_proj.weight"):
            out[name] = t[:, idx(hv)]
    return out


def _float(w) -> torch.Tensor:
    """A loaded tensor as float32: quantized blocks dequantized with gguf's reference."""
    if isinstance(w, QuantizedTensor):
        return dequantize_reference(w.data, w.fmt.name, w.cols).reshape(-1, w.cols).float()
    if isinstance(w, ExpertWeights):
        if not w.quantized:
            return w.data.float()
        return torch.stack(
            [dequantize_reference(e, w.fmt.name, w.cols).reshape(-1, w.cols) for e in w.data]
        ).float()
    return w


@pytest.mark.parametrize("arch", ARCHS)
def test_config_matches_hf(arch, models, tokenizer_dir, tmp_path):
    hf = models[arch]
    config, _ = _load(write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf")))
    ref = hf.config
    assert config.architectures == [ARCHITECTURES[arch]]
    assert type(config) is type(ref)
    for key in _CONFIG_FIELDS + (_MOE_FIELDS if arch != "qwen35" else ()):
        assert getattr(config, key) == getattr(ref, key), key
    assert config.rms_norm_eps == pytest.approx(ref.rms_norm_eps)  # stored as float32
    ours, theirs = config.rope_parameters, ref.rope_parameters
    for key in ("rope_type", "rope_theta", "partial_rotary_factor", "mrope_section"):
        assert ours.get(key) == theirs.get(key), key
    assert bool(ours.get("mrope_interleaved")) == bool(theirs.get("mrope_interleaved"))
    # the V heads stay in the file's tiled order (qwen35/qwen35moe with nk != nv only)
    assert getattr(config, "linear_value_heads_tiled", False) is (arch != "qwen3next")
    assert not getattr(ref, "linear_value_heads_tiled", False)
    if arch == "qwen3next":
        assert config.norm_topk_prob and config.mlp_only_layers == []
        assert config.intermediate_size == ref.intermediate_size


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("keep_quantized", [False, True], ids=["float", "keep"])
def test_weights_equal_hf(arch, keep_quantized, models, tokenizer_dir, tmp_path):
    """Every HF tensor comes back, bit for bit (A_log too: -exp of it is the file's ssm_a), its
    V heads in the file's order."""
    hf = models[arch]
    _, got = _load(write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf")), keep_quantized)
    want = _file_order(arch, hf, expected_weights(hf))
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        w = _float(got[name])
        assert w.dtype == torch.float32 and w.shape == ref.shape, name
        assert torch.equal(w, ref), f"{name}: max |diff| {(w - ref).abs().max().item():.3g}"


def _q8_tolerance(ref: torch.Tensor) -> torch.Tensor:
    """Q8_0's bound per row: half a step (block max / 127) plus the f16 scale's rounding; a
    requantized matrix (two roundings) stays under one step of its row's max."""
    return ref.abs().amax(-1, keepdim=True) / 127 * 1.01 + 1e-6


def _warnings(caplog) -> list[str]:
    """radixlm's warnings in the test: not the gguf writer's INFO lines, which reach caplog when an
    earlier test on the worker left the root logger at INFO."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("radixlm") and r.levelno >= logging.WARNING
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_q8_0_within_quantization_error(arch, models, tokenizer_dir, tmp_path, caplog):
    hf = models[arch]
    path = write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf"), qtype="q8_0")
    want = _file_order(arch, hf, expected_weights(hf))
    _, floats = _load(path)
    with caplog.at_level(logging.WARNING, logger="radixlm.model.gguf.archs.qwen35"):
        _, kept = _load(path, keep_quantized=True)
    assert sorted(floats) == sorted(want) == sorted(kept)
    for name, ref in want.items():
        w, q = floats[name], _float(kept[name])
        assert w.shape == ref.shape == q.shape, name
        assert ((w - ref).abs() <= _q8_tolerance(ref)).all(), name
        assert torch.equal(q, w), f"{name}: the kept blocks are not the file's"
    assert _warnings(caplog) == []  # nothing requantized
    qkv = kept[f"model.layers.0.linear_attn.in_proj_qkv{'z' if arch == 'qwen3next' else ''}.weight"]
    assert isinstance(qkv, QuantizedTensor) and qkv.fmt.name == "q8_0"


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_tiled_out_proj_keeps_the_file_blocks(arch, models, tokenizer_dir, tmp_path, caplog):
    """out_proj's columns stay in the file's tiled order, so its quantized blocks load as stored,
    byte for byte, even where a V head is less than a block (qwen35moe: 16 columns in Q8_0's
    32-value blocks, as Dv=128 in Q4_K's 256): no requantization, no warning."""
    hf = models[arch]
    path = write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf"), qtype="q8_0")
    with caplog.at_level(logging.WARNING, logger="radixlm.model.gguf.archs.qwen35"):
        config, kept = _load(path, keep_quantized=True)
    assert config.linear_value_heads_tiled
    stored = {t.name: t for t in open_gguf(path).tensors}
    for il, kind in enumerate(config.layer_types):
        if kind != "linear_attention":
            continue
        w = kept[f"model.layers.{il}.linear_attn.out_proj.weight"]
        t = stored[f"blk.{il}.ssm_out.weight"]
        assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
        assert isinstance(w, QuantizedTensor) and w.fmt.name == "q8_0"
        raw = torch.from_numpy(np.array(t.data).view(np.uint8).reshape(-1))
        assert torch.equal(w.data.reshape(-1), raw), il
    assert _warnings(caplog) == []  # nothing requantized


def test_qwen3next_legacy_ssm_in(models, tokenizer_dir, tmp_path):
    """Older converters kept in_proj_qkvz whole as ssm_in: read as it is."""
    hf = models["qwen3next"]
    path = write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf"), legacy_qkvz=True)
    assert any(t.name == "blk.0.ssm_in.weight" for t in open_gguf(path).tensors)
    _, got = _load(path)
    want = expected_weights(hf)
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[n], w) for n, w in want.items())


def test_qwen3next_qkvz_halves_of_two_types(models, tokenizer_dir, tmp_path, caplog):
    """attn_qkv Q8_0 beside attn_gate F16: in_proj_qkvz requantized to Q8_0, with a warning."""
    hf = models["qwen3next"]
    plain = write_gguf(hf, tokenizer_dir, str(tmp_path / "plain.gguf"))
    z = next(t for t in open_gguf(plain).tensors if t.name == "blk.0.attn_gate.weight")
    f16 = np.asarray(z.data, dtype=np.float32).astype(np.float16)
    path = write_gguf(
        hf,
        tokenizer_dir,
        str(tmp_path / "m.gguf"),
        qtype="q8_0",
        overrides={"blk.0.attn_gate.weight": (f16, gguf.GGMLQuantizationType.F16)},
    )
    with caplog.at_level(logging.WARNING, logger="radixlm.model.gguf.archs.qwen35"):
        _, kept = _load(path, keep_quantized=True)
    w = kept["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    assert isinstance(w, QuantizedTensor) and w.fmt.name == "q8_0"
    ref = expected_weights(hf)["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    assert ((_float(w) - ref).abs() <= _q8_tolerance(ref)).all()
    assert "attn_qkv/attn_gate are Q8_0/F16" in caplog.text


def test_mtp_block_skipped(models, tokenizer_dir, tmp_path):
    """Qwen3.5's MTP block (appended layers, nextn_predict_layers) is not part of HF's model."""
    hf = models["qwen35"]
    path = write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf"), mtp_layers=1)
    config, got = _load(path)
    assert config.num_hidden_layers == 4 and len(config.layer_types) == 4
    assert sorted(got) == sorted(expected_weights(hf))


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "q8_0"])
def test_tensor_parallel_slices(quantized, models, tokenizer_dir, tmp_path):
    """A rank's slice is cut from the tensor as loaded (ssm_a and conv1d read whole first)."""
    hf = models["qwen35"]
    path = write_gguf(
        hf, tokenizer_dir, str(tmp_path / "m.gguf"), qtype="q8_0" if quantized else "f32"
    )
    cuts = {
        "model.layers.0.linear_attn.in_proj_qkv.weight": TensorSlice(0, ((0, 16), (64, 48))),
        "model.layers.0.linear_attn.in_proj_z.weight": TensorSlice.of(0, 32, 64),
        "model.layers.0.linear_attn.out_proj.weight": TensorSlice.of(1, 64, 64),
        "model.layers.0.linear_attn.A_log": TensorSlice.of(0, 2, 2),
        "model.layers.0.linear_attn.conv1d.weight": TensorSlice.of(0, 64, 128),
    }
    _, got = _load(path, keep_quantized=quantized, slicer=cuts.get)
    _, whole = _load(path, keep_quantized=quantized)
    for name, s in cuts.items():
        ref = _float(whole[name])
        parts = [ref[a : a + n] if s.dim == 0 else ref[:, a : a + n] for a, n in s.ranges]
        assert torch.equal(_float(got[name]), torch.cat(parts, s.dim)), name


@pytest.mark.parametrize(
    "tensor, shape",
    [
        ("blk.1.ssm_conv1d.weight", (190, 4)),
        ("blk.2.ssm_a", (3,)),
        ("blk.0.ssm_out.weight", (64, 96)),
    ],
)
def test_mismatched_shapes_named(tensor, shape, models, tokenizer_dir, tmp_path):
    hf = models["qwen35"]
    bad = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    if tensor.endswith("ssm_a"):
        bad = -np.abs(bad)
    path = write_gguf(hf, tokenizer_dir, str(tmp_path / "m.gguf"), overrides={tensor: bad})
    with pytest.raises(ValueError, match=rf"{tensor}.*shape"):
        _load(path)
