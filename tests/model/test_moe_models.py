"""MoE families against HF transformers (the pinned version: pyproject's test extras) on tiny
random-weight configs (hidden 64, 2 layers, 8 experts, top-2, float32), loaded from each checkpoint
layout radixlm reads: safetensors per expert (save_pretrained), stacked 3-D (transformers 5.x's
in-memory names) and GGUF (llama.cpp's ffn_*_exps): logits to 1e-4 and 32 greedy tokens identical.
Quantized experts (GGUF q8_0 / q4_k blocks kept as stored, --quantization q8_0 per expert) against
HF with the same dequantized weights, within the activation-quantization error stated below."""

from __future__ import annotations

import pytest
import torch

from radixlm.kernels.formats import INTERLEAVED  # experts are kept in the kernels' 8-row layout
from radixlm.model.layers.moe.moe_block import SparseMoeBlock
from radixlm.model.loader import load_model
from tests.model.helpers import PoolHarness, hf_logits
from tests.model.moe_checkpoints import ARCHITECTURES, FAMILIES, hf_model, save_stacked, write_gguf

ATOL = 1e-4
PROMPT = [5, 17, 200, 33, 9, 120, 77, 3, 44, 250, 18]
NEW_TOKENS = 32
# Quantized experts: the native kernels quantize activations to 8 bits (as llama.cpp does), so
# logits of O(1) move by up to ~1e-2 against HF on the same dequantized weights.
QUANT_ATOL = 3e-2


def _write(hf, kind: str, tmp) -> str:
    if kind == "per_expert":
        hf.save_pretrained(tmp)
        return str(tmp)
    if kind == "stacked":
        return save_stacked(hf, str(tmp))
    return write_gguf(hf, str(tmp / "model.gguf"))


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


def our_greedy(model, config, ids: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    """(prefill logits, n greedy tokens: the prefill's, then n - 1 decode steps)."""
    h = PoolHarness(model, config)
    r = h.new_request()
    logits = h.extend([r], [ids])[0]
    out = [int(logits[-1].argmax())]
    for _ in range(n - 1):
        out.append(int(h.decode([r], [out[-1]])[0].argmax()))
    return logits, out


@pytest.mark.parametrize("kind", ["per_expert", "stacked", "gguf"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_family_matches_hf(family, kind, tmp_path):
    hf = hf_model(family)
    loaded = load_model(_write(hf, kind, tmp_path), quantization="none")
    assert loaded.architecture == ARCHITECTURES[family]
    blocks = [m for m in loaded.model.modules() if isinstance(m, SparseMoeBlock)]
    sparse = [
        i
        for i in range(hf.config.num_hidden_layers)
        if i not in (getattr(hf.config, "mlp_only_layers", None) or [])
    ]
    assert [b.layer_id for b in blocks] == sparse  # dense layers where the config has them
    logits, tokens = our_greedy(loaded.model, loaded.hf_config, PROMPT, NEW_TOKENS)
    torch.testing.assert_close(logits, hf_logits(hf, PROMPT), atol=ATOL, rtol=0)
    assert tokens == hf_greedy(hf, PROMPT, NEW_TOKENS)


def _dequantized_reference(hf, loaded) -> None:
    """hf's experts replaced by the dequantized blocks radixlm holds (the reference for quantized
    runs)."""
    for b in loaded.model.modules():
        if isinstance(b, SparseMoeBlock):
            experts = hf.model.layers[b.layer_id].mlp.experts
            experts.gate_up_proj.data.copy_(b.w13.dequantize())
            experts.down_proj.data.copy_(b.w2.dequantize())


@pytest.mark.parametrize("experts_type", ["q8_0", "q4_k"])
def test_quantized_gguf_experts(experts_type, tmp_path):
    # q4_k blocks 256 values: experts' input sizes (hidden, moe_intermediate_size) of 256.
    hf = hf_model(
        "qwen3_moe", hidden_size=256, moe_intermediate_size=256, num_attention_heads=4, head_dim=64
    )
    loaded = load_model(write_gguf(hf, str(tmp_path / "q.gguf"), experts_type=experts_type))
    assert loaded.quantization == "gguf"
    blocks = [m for m in loaded.model.modules() if isinstance(m, SparseMoeBlock)]
    assert blocks and all(
        b.w13.fmt == INTERLEAVED[experts_type] and b.w2.fmt == INTERLEAVED[experts_type]
        for b in blocks
    )
    _dequantized_reference(hf, loaded)
    logits, _ = our_greedy(loaded.model, loaded.hf_config, PROMPT, 1)
    ref = hf_logits(hf, PROMPT)
    err = (logits - ref).abs().max().item()
    assert err < QUANT_ATOL, err
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_quantization_flag_quantizes_each_expert(tmp_path):
    """--quantization q8_0 of a float checkpoint: each expert's matrices are exactly its own q8_0
    blocks (what QuantizedTensor.quantize makes of HF's matrix), held without a float copy."""
    from radixlm.model.layers.quantized import QuantizedTensor

    hf = hf_model("mixtral")
    hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), quantization="q8_0")
    blocks = [m for m in loaded.model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 2
    for b in blocks:
        assert (
            b.w13.fmt == INTERLEAVED["q8_0"]
            and b.w2.fmt == INTERLEAVED["q8_0"]
            and b.w13_weight.dtype == torch.uint8
        )
        experts = hf.model.layers[b.layer_id].mlp.experts
        for e in range(8):
            # the same blocks, in the kernels' 8-row interleaved layout
            # (QuantizedTensor.interleaved)
            assert torch.equal(
                b.w13.data[e],
                QuantizedTensor.quantize(experts.gate_up_proj[e].detach(), "q8_0")
                .interleaved()
                .data,
            )
            assert torch.equal(
                b.w2.data[e],
                QuantizedTensor.quantize(experts.down_proj[e].detach(), "q8_0").interleaved().data,
            )


def test_missing_expert_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = hf_model("olmoe")
    hf.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="layer 1 expert 5 up_proj"):
        load_model(str(tmp_path), quantization="none")
