"""GGUF F16 / BF16 weights kept 16-bit on the native kernels, and weights in a GGUF type with no
kernel refused at load by name (never silently widened to float32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from radixlm.kernels.formats import FORMATS
from radixlm.model.gguf.loader import gguf_weights
from radixlm.model.gguf.reader import open_gguf
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.loader import load_model
from tests.model.helpers import SMALL, PoolHarness, hf_logits, randomize
from tests.model.test_gguf_archs import ATOL, _write_gguf, write_and_close


def _write(path, tensors: dict) -> None:
    """name -> float array (its dtype picks F32 / F16) or (bytes, GGMLQuantizationType)."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    for name, t in tensors.items():
        if isinstance(t, tuple):
            w.add_tensor(name, t[0], raw_dtype=t[1])
        else:
            w.add_tensor(name, t)
    write_and_close(w)


def test_f16_and_bf16_matrices_stay_16_bit(tmp_path):
    import gguf

    g = torch.Generator().manual_seed(0)
    down, up, gate = (torch.randn(8, 40, generator=g) for _ in range(3))
    norm = torch.randn(40, generator=g)
    path = str(tmp_path / "f16.gguf")
    _write(
        path,
        {
            "blk.0.ffn_down.weight": down.half().numpy(),
            "blk.0.ffn_up.weight": (
                up.bfloat16().view(torch.uint8).numpy(),
                gguf.GGMLQuantizationType.BF16,
            ),
            "blk.0.ffn_gate.weight": gate.numpy(),
            "blk.0.attn_norm.weight": norm.half().numpy(),  # 1-D: float32 always
        },
    )
    want = {
        "model.layers.0.mlp.down_proj.weight": down.half().float(),
        "model.layers.0.mlp.up_proj.weight": up.bfloat16().float(),
        "model.layers.0.mlp.gate_proj.weight": gate,
        "model.layers.0.input_layernorm.weight": norm.half().float(),
    }
    kept = dict(gguf_weights(open_gguf(path), None, keep_quantized=True))
    assert set(kept) == set(want)
    for name, fmt, src in (("down_proj", "f16", down.half()), ("up_proj", "bf16", up.bfloat16())):
        t = kept[f"model.layers.0.mlp.{name}.weight"]
        assert isinstance(t, QuantizedTensor) and t.fmt == FORMATS[fmt] and t.shape == (8, 40)
        assert torch.equal(t.data, src.view(torch.uint8))  # the file's bytes, 2 per value
        assert torch.equal(t.dequantize(), want[f"model.layers.0.mlp.{name}.weight"])
    for name in ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.input_layernorm.weight"):
        assert kept[name].dtype == torch.float32 and torch.equal(kept[name], want[name])
    # --quantization none: everything float32, the same values.
    for name, t in gguf_weights(open_gguf(path), None, keep_quantized=False):
        assert t.dtype == torch.float32 and torch.equal(t, want[name]), name


@pytest.mark.parametrize("type_name", ["IQ2_XXS", "IQ3_S", "TQ1_0", "Q8_1"])
def test_types_without_a_kernel_are_refused_by_name(tmp_path, type_name):
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    path = str(tmp_path / "unsupported.gguf")
    _write(
        path,
        {
            "output_norm.weight": np.ones(block, np.float32),
            "blk.3.ffn_down.weight": (np.zeros((4, block_bytes), np.uint8), qtype),
        },
    )
    with pytest.raises(
        ValueError,
        match=rf"blk\.3\.ffn_down\.weight \(model\.layers\.3\.mlp\.down_proj\.weight\): "
        rf"GGUF type {type_name} has no native kernel",
    ) as e:
        list(gguf_weights(open_gguf(path), None, keep_quantized=True))
    assert "Q4_K" in str(e.value) and "BF16" in str(e.value)  # names what is supported
    if type_name == "IQ2_XXS":  # --quantization none still dequantizes it (zero blocks: zeros)
        out = dict(gguf_weights(open_gguf(path), None, keep_quantized=False))
        assert torch.equal(out["model.layers.3.mlp.down_proj.weight"], torch.zeros(4, block))


@pytest.mark.parametrize("matrix_type", ["f16", "bf16"])
def test_16_bit_llama_runs_on_the_kernels(tmp_path, matrix_type):
    """A llama GGUF with every matrix 16-bit (embedding, LM head, projections) loads them kept
    16-bit and gives the logits of the HF model whose weights are those 16-bit values."""
    cfg = transformers.LlamaConfig(**{**SMALL, "tie_word_embeddings": False})
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    randomize(hf)
    dtype = torch.float16 if matrix_type == "f16" else torch.bfloat16
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.copy_(p.to(dtype).float())
    path = str(tmp_path / f"{matrix_type}.gguf")
    _write_gguf(path, "llama", hf, cfg, matrix_type=matrix_type)

    loaded = load_model(path)
    m = loaded.model
    assert m.model.embed_tokens.qweight.formats == [matrix_type]
    assert m.lm_head.qweight.formats == [matrix_type]
    assert m.model.layers[0].mlp.down_proj.qweight.formats == [matrix_type]
    assert m.model.layers[1].self_attn.qkv_proj.qweight.formats == [matrix_type]
    h = PoolHarness(m, loaded.hf_config)
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, SMALL["vocab_size"], (n,), generator=g).tolist() for n in (12, 7)]
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-1] for s in seqs])
    outs = [
        torch.cat([o, d[None]])
        for o, d in zip(outs, h.decode(reqs, [s[-1] for s in seqs]), strict=True)
    ]
    for s, o in zip(seqs, outs, strict=True):
        assert (o - hf_logits(hf, s)).abs().max().item() < ATOL
