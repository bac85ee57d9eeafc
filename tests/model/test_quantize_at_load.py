"""A bf16 safetensors checkpoint with --quantization: quantized as it streams in (each matrix in
the asked format, none ever widened to float32), each matrix exactly the format's quantization of
the checkpoint's values and, on the activations it receives in the model's forward, giving the float
product of those values once its input is on the kernels' int8 grid; --quantization bf16 keeps the
16-bit weights and matches HF's model on them. The time spent quantizing is logged."""

from __future__ import annotations

import logging
import os

import torch
import transformers

from radixlm.kernels.formats import dequantize_reference, quantize
from radixlm.model.loader import load_model
from tests.model.helpers import hf_logits, randomize
from tests.model.test_gguf_mixed_quants import REL_TOL, _logits, on_kernel_grids

MATRICES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _bf16_checkpoint(tmp_path, arch: str, tie: bool, vocab: int):
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    cfg = config_cls(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    randomize(hf)
    path = str(tmp_path / f"{arch}-bf16")
    hf.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    # The float model of the checkpoint's exact values (loaded afresh: a cast model would keep its
    # RoPE frequencies rounded to bf16).
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    return path, ref.eval(), cfg


def _size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(path, f))
        for f in os.listdir(path)
        if f.endswith(".safetensors")
    )


def test_bf16_checkpoint_quantized_to_q4_k_at_load(tmp_path, caplog):
    path, _, cfg = _bf16_checkpoint(tmp_path, "llama", tie=False, vocab=500)
    with caplog.at_level(logging.INFO, logger="radixlm.model.quant.methods"):
        quant = load_model(path, quantization="q4_k")
    assert quant.quantization == "q4_k"
    assert "quantized 16 matrices to q4_k in" in caplog.text  # 7 per layer, embedding, lm_head
    flat = load_model(path, quantization="none")
    layers, fl = quant.model.model.layers, flat.model.model.layers
    for i in range(cfg.num_hidden_layers):
        for name in MATRICES:
            q = getattr(
                layers[i].self_attn if "o_proj" in name or "qkv" in name else layers[i].mlp, name
            )
            f = getattr(fl[i].self_attn if "o_proj" in name or "qkv" in name else fl[i].mlp, name)
            assert q.qweight.formats == ["q4_kx8"], (
                i,
                name,
                q.qweight.formats,
            )  # the Q4_K_M kernels
            want = dequantize_reference(quantize(f.weight, "q4_k"), "q4_k", f.weight.shape[1])
            assert torch.equal(q.qweight.dequantize(), want), (i, name)
            f.weight.data.copy_(want)  # the float model of the same values, for the logits below
    # 500 rows do not group by 8: plain Q4_K blocks.
    for q, f in (
        (quant.model.lm_head, flat.model.lm_head),
        (quant.model.model.embed_tokens, flat.model.model.embed_tokens),
    ):
        assert q.qweight.formats == ["q4_k"]
        f.weight.data.copy_(q.qweight.dequantize())
    assert quant.weight_bytes < 0.35 * _size(path), (quant.weight_bytes, _size(path))
    ids = torch.randint(
        0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(3)
    ).tolist()
    # Each quantized matrix, on the activations it received in the quantized model's own forward,
    # gives the float product of the same weights with its input on the kernels' int8 grid. (Through
    # a whole float model with the grid applied the comparison is not exact: a 1e-7 difference
    # upstream can move one activation across an int8 rounding boundary, a step of 1/127 of a
    # block.)
    seen = []
    for name, module in quant.model.named_modules():
        if name == "lm_head" or name.endswith(MATRICES):
            module.register_forward_hook(
                lambda m, args, out, name=name: seen.append(
                    (name, args[0].detach().clone(), out.detach().clone())
                )
            )
    got = _logits(quant, ids)
    assert sorted({name for name, _, _ in seen}) == sorted(
        ["lm_head"]
        + [
            f"model.layers.{i}.{part}.{m}"
            for i in range(cfg.num_hidden_layers)
            for part, m in [
                ("self_attn", "qkv_proj"),
                ("self_attn", "o_proj"),
                ("mlp", "gate_up_proj"),
                ("mlp", "down_proj"),
            ]
        ]
    )
    floats, quants = dict(flat.model.named_modules()), dict(quant.model.named_modules())
    for name, x, out in seen:
        want = on_kernel_grids(quants[name].qweight, x, floats[name].weight)
        rel = (out - want).abs().max().item() / want.abs().max().item()
        assert rel < REL_TOL, (name, rel)
    assert got.shape == (len(ids), cfg.vocab_size) and torch.isfinite(got).all()


def test_bf16_checkpoint_stays_16_bit(tmp_path):
    path, hf, cfg = _bf16_checkpoint(tmp_path, "qwen2", tie=True, vocab=512)
    loaded = load_model(path, quantization="bf16")
    layer = loaded.model.model.layers[0]
    assert layer.self_attn.qkv_proj.qweight.formats == ["bf16"]
    assert loaded.model.model.embed_tokens.qweight.formats == ["bf16"]
    assert loaded.weight_bytes < 1.05 * _size(path), (loaded.weight_bytes, _size(path))
    ids = torch.randint(
        0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(4)
    ).tolist()
    got, want = _logits(loaded, ids), hf_logits(hf, ids)
    rel = (got - want).abs().max().item() / want.abs().max().item()
    assert rel < REL_TOL, rel
    assert torch.equal(got.argmax(-1), want.argmax(-1))
