"""A Q4_K_M-style GGUF (Q4_K, Q6_K, Q5_0 and Q8_0 tensors side by side, fused layers whose shards
differ in type) runs on the native kernels in the file's own types: nothing is widened to float
(weights held <= 1.3x the file), each matrix holds exactly the file's values (dequantized bitwise
equal to the --quantization none load, itself checked against HF in test_gguf_archs), and the
logits are that float model's once each linear layer's input is rounded to its kernels' int8 grid
(per 32 values, or per 256 for the interleaved K-quants; the exact reference: the kernels' integer
dots are exact, only float32 summation order differs)."""

from __future__ import annotations

import os

import numpy as np
import torch
import transformers

from radixlm.kernels.formats import FORMATS, K_ACTIVATIONS, dequantize_reference, quantize
from radixlm.kernels.ops import ops
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.loader import load_model
from tests.kernels.test_quant_gemm import random_quantized
from tests.model.helpers import PoolHarness, randomize
from tests.model.test_gguf_archs import _llama_cpp_permute, _write_gguf

# What a Q4_K_M file mixes, per tensor (llama.cpp's rules give v / down more bits in some layers
# and the 32-value types where rows do not fill 256-value blocks).
TYPES = {
    "token_embd": "q4_k",
    "output": "q6_k",
    "blk.0.attn_q": "q4_k",
    "blk.0.attn_k": "q4_k",
    "blk.0.attn_v": "q6_k",
    "blk.0.attn_output": "q4_k",
    "blk.0.ffn_gate": "q4_k",
    "blk.0.ffn_up": "q4_k",
    "blk.0.ffn_down": "q6_k",
    "blk.1.attn_q": "q4_k",
    "blk.1.attn_k": "q4_k",
    "blk.1.attn_v": "q5_0",
    "blk.1.attn_output": "q4_k",
    "blk.1.ffn_gate": "q4_k",
    "blk.1.ffn_up": "q4_k",
    "blk.1.ffn_down": "q8_0",
}
HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Scales of the random K-quant blocks (fp16 d, dmin): values of O(0.05), like a trained model's.
SCALE = {"q4_k": 1e-4, "q6_k": 2e-5}
# vs the exact reference, relative to max |logit|: observed ~5e-7 (float32 order); a wrong block,
# shard, scale or row order moves logits by O(0.1) of it. (Against the plain float model this random
# model differs by ~0.3 of max |logit|: its activations are that sensitive to 8-bit rounding.)
REL_TOL = 1e-4


def _blocks(name: str, rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    if name not in SCALE:  # gguf's own quantizer, values O(0.05)
        return quantize(0.05 * torch.randn(rows, cols, generator=g), name)
    raw = random_quantized(name, rows, cols, g)
    blocks = raw.view(rows, -1, FORMATS[name].block_bytes)
    d = (
        (SCALE[name] * (0.5 + torch.rand(rows, blocks.shape[1], 2, generator=g)))
        .half()
        .view(torch.uint8)
    )
    if name == "q4_k":
        blocks[:, :, 0:4] = d.reshape(rows, -1, 4)
    else:
        blocks[:, :, 208:210] = d.reshape(rows, -1, 4)[:, :, :2]
    return raw


def _mixed_model(tmp_path):
    import gguf

    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    randomize(hf)
    g = torch.Generator().manual_seed(2)
    raw = {}
    state = hf.state_dict()
    with torch.no_grad():
        for gname, qname in TYPES.items():
            if gname.startswith("blk."):
                _, layer, kind = gname.split(".")
                hf_name = f"model.layers.{layer}.{HF_NAMES[kind]}.weight"
            else:
                hf_name = {"token_embd": "model.embed_tokens.weight", "output": "lm_head.weight"}[
                    gname
                ]
            rows, cols = state[hf_name].shape
            blocks = _blocks(qname, rows, cols, g)
            values = dequantize_reference(blocks, qname, cols).numpy()
            # The file holds q / k rows in llama.cpp's permuted order: HF's are the inverse.
            heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(
                gname.split(".")[-1]
            )
            if heads:
                perm = _llama_cpp_permute(np.arange(rows), heads)
                values = values[np.argsort(perm)]
            state[hf_name].copy_(torch.from_numpy(values))
            raw[f"{gname}.weight"] = (blocks.numpy(), gguf.GGMLQuantizationType[qname.upper()])
    path = str(tmp_path / "mixed.q4_k_m.gguf")
    _write_gguf(path, "llama", hf, cfg, raw_blocks=raw)
    return path, cfg


def test_mixed_quant_file_runs_in_its_own_types(tmp_path):
    path, cfg = _mixed_model(tmp_path)
    quant = load_model(path)
    flat = load_model(path, quantization="none")
    layers = quant.model.model.layers
    # Each matrix in the file's types, interleaved where the format has a layout; shards of two
    # types side by side in one fused layer.
    assert layers[0].self_attn.qkv_proj.qweight.formats == ["q4_kx8", "q6_kx8"]
    assert layers[1].self_attn.qkv_proj.qweight.formats == ["q4_kx8", "q5_0x8"]
    assert layers[0].mlp.gate_up_proj.qweight.formats == ["q4_kx8"]
    assert layers[1].mlp.down_proj.qweight.formats == ["q8_0x8"]
    assert quant.model.lm_head.qweight.formats == ["q6_kx8"]
    assert quant.model.model.embed_tokens.qweight.formats == ["q4_kx8"]
    # Never widened: the weights held stay within 1.3x the file (the K-quants' byte scales: +2.8%).
    assert quant.weight_bytes <= 1.3 * os.path.getsize(path), (
        quant.weight_bytes,
        os.path.getsize(path),
    )
    assert flat.weight_bytes > 3 * quant.weight_bytes  # the float load really is float
    # The file's values exactly.
    fl = flat.model.model.layers
    for i in range(cfg.num_hidden_layers):
        for q, f in (
            (layers[i].self_attn.qkv_proj, fl[i].self_attn.qkv_proj),
            (layers[i].mlp.down_proj, fl[i].mlp.down_proj),
            (layers[i].mlp.gate_up_proj, fl[i].mlp.gate_up_proj),
            (layers[i].self_attn.o_proj, fl[i].self_attn.o_proj),
        ):
            assert torch.equal(q.qweight.dequantize(), f.weight), f"layer {i}"
    assert torch.equal(quant.model.lm_head.qweight.dequantize(), flat.model.lm_head.weight)
    # Logits: the float model's with each linear layer's input on the int8 grid.
    ids = torch.randint(
        0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(3)
    ).tolist()
    got = _logits(quant, ids)
    quantized = dict(quant.model.named_modules())
    for name, module in flat.model.named_modules():
        if name == "lm_head" or name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            module.register_forward_hook(_on_kernel_grids(quantized[name].qweight))
    want = _logits(flat, ids)
    scale = want.abs().max().item()
    rel = (got - want).abs().max().item() / scale
    print(f"mixed Q4_K_M-style: max|diff| {rel:.3e} of max|logit| {scale:.2f}")
    assert rel < REL_TOL
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def _logits(loaded, ids: list[int]) -> torch.Tensor:
    h = PoolHarness(loaded.model, loaded.hf_config)
    return h.extend([h.new_request()], [ids])[0]


def _int8_grid(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x rounded as a format's kernel rounds activations: int8 per 32 values, or per 256 for the
    formats that take Q8_K activations."""
    if fmt in K_ACTIVATIONS:
        q, d, _ = ops().quantize_act_k(x)
        block = 256
    else:
        q, d, _ = ops().quantize_act(x)
        block = 32
    return (q.float().view(x.shape[0], -1, block) * d[:, :, None]).view(x.shape)


def on_kernel_grids(qmatrix, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T with each row segment of the quantized matrix `qmatrix` taking x on that
    segment's kernel grid (fused shards of two types round their input differently)."""
    flat = x.reshape(-1, x.shape[-1]).float().contiguous()
    parts = [
        (_int8_grid(flat, seg.weight.fmt.name) if isinstance(seg.weight, QuantizedTensor) else flat)
        @ weight[seg.start : seg.start + seg.rows].T
        for seg in qmatrix.segments
    ]
    return torch.cat(parts, dim=-1).view(*x.shape[:-1], -1)


def _on_kernel_grids(qmatrix):
    """Forward hook for a float layer: its output as on_kernel_grids makes it."""

    def hook(module, args, out):
        y = on_kernel_grids(qmatrix, args[0], module.weight)
        bias = getattr(module, "bias", None)
        return y if bias is None else y + bias

    return hook
