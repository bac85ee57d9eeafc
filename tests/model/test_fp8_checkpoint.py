"""FP8 checkpoints in llm-compressor's compressed-tensors layout (quant/fp8_checkpoint.py): tiny
Llama / Qwen3 models quantized here as its FP8 schemes write them (e4m3 weights, weight_scale per
channel, per 128 x 128 block or per tensor; the LM head ignored, the rest 16-bit), selected by their
config.json alone, held as e4m3 (never float) within 1.2x the file, and generating HF's greedy
tokens (float32 on the dequantized weights, near-tie rule) through prefill and decode."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers

from radixlm.model.layers.quantized import QuantizedMatrix
from radixlm.model.loader import load_model
from radixlm.model.quant.checkpoint import parse_quantization_config
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.helpers import randomize
from tests.model.test_awq_gptq import (
    LINEARS,
    SHAPE,
    _greedy_radixlm,
    _matrices,
    _reference,
    checkpoint_cache,
)

E4M3_MAX = 448.0
CASES = {  # key: (architecture, strategy)
    "llama-channel": ("llama", "channel"),  # FP8_DYNAMIC
    "qwen3-block": ("qwen3", "block"),  # FP8_BLOCK: k_proj's 64 rows are one partial block
    "llama-tensor": ("llama", "tensor"),  # FP8 (static)
}


def fp8_quantize(w: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 weight, weight_scale as the scheme stores it, the dequantized float32 weight)."""
    rows, cols = w.shape
    if strategy == "channel":
        scale = w.abs().amax(1, keepdim=True) / E4M3_MAX
        full = scale.expand(rows, cols)
    elif strategy == "tensor":
        scale = (w.abs().amax() / E4M3_MAX).reshape(1)
        full = scale.expand(rows, cols)
    else:  # [128, 128] blocks, the last ones partial (ceil)
        br, bc = -(-rows // 128), -(-cols // 128)
        padded = torch.zeros(br * 128, bc * 128)
        padded[:rows, :cols] = w
        scale = padded.reshape(br, 128, bc, 128).abs().amax((1, 3)) / E4M3_MAX
        full = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    q = (w / full).to(torch.float8_e4m3fn)
    return q, scale, q.float() * full


def write_checkpoint(
    path: str,
    arch: str,
    strategy: str,
    seed: int = 0,
    shape: dict = SHAPE,
    scale_name: str = "weight_scale",
    config: dict | None = None,
):
    """The checkpoint at path (bf16 beside the e4m3 weights, as llm-compressor saves) and HF's
    float32 model on its dequantized weights (the reference). scale_name and config (the
    quantization_config; default compressed-tensors') write the other layouts of the same values
    (test_fp8_serialized.py); a per-tensor layer also gets a static activation scale."""
    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[arch]
    cfg = cls(**shape)
    cfg.architectures = [cls.__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    randomize(hf)
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        hf.lm_head.weight.mul_(8)  # logits of a real model's spread: greedy choices off ties
        for name, p in hf.named_parameters():
            p.copy_(p.bfloat16().float())
            prefix, _, kind = name.rpartition(".")
            if kind != "weight" or prefix.rpartition(".")[2] not in LINEARS:
                tensors[name] = p.detach().bfloat16()
                continue
            q, scale, deq = fp8_quantize(p.detach(), strategy)
            tensors[name], tensors[prefix + "." + scale_name] = q, scale
            if strategy == "tensor":  # a static scheme's activation scale, read past on the CPU
                tensors[prefix + ".input_scale"] = torch.ones(1)
            p.copy_(deq)
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    d = cfg.to_dict()
    d["quantization_config"] = config or quantization_config(strategy)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f)
    return hf, tensors


def quantization_config(strategy: str) -> dict:
    weights = dict(num_bits=8, type="float", symmetric=True, dynamic=False, strategy=strategy)
    acts = dict(num_bits=8, type="float", symmetric=True, dynamic=True, strategy="token")
    if strategy == "block":
        weights["block_structure"] = [128, 128]
        acts = dict(acts, strategy="group", group_size=128)
    if strategy == "tensor":
        acts = dict(acts, dynamic=False, strategy="tensor")
    return dict(
        quant_method="compressed-tensors",
        format="float-quantized",
        quantization_status="compressed",
        config_groups={
            "group_0": dict(targets=["Linear"], weights=weights, input_activations=acts)
        },
        ignore=["lm_head"],
        kv_cache_scheme=None,
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, native_kernels_built):
    assert native_kernels_built, "the native kernels failed to build"
    return checkpoint_cache(tmp_path_factory, lambda path, key: write_checkpoint(path, *CASES[key]))


@pytest.mark.parametrize("key", list(CASES))
def test_checkpoint_loads_fp8_and_generates_hf_greedy(checkpoints, key):
    path, hf, tensors, loaded = checkpoints(key)
    assert loaded.quantization == "compressed-tensors"  # from config.json alone
    assert_fp8_model_is_hf(path, hf, tensors, loaded, key)


def assert_fp8_model_is_hf(path: str, hf, tensors: dict, loaded, label: str, shape=SHAPE) -> None:
    """Every linear layer held as e4m3 (never float), each the checkpoint's dequantized weight
    exactly, within 1.04x the file's FP8 bytes and the model within 1.2x the file; HF's greedy
    tokens through prefill and decode."""
    for m in _matrices(loaded):
        assert m.weight is None, "a float weight is held"
        assert isinstance(m.qweight, QuantizedMatrix) and m.qweight.formats == ["fp8_e4m3"]
    # Each matrix holds the checkpoint's dequantized weight exactly (q * s, as HF computes it).
    layer = loaded.model.model.layers[1]
    qkv = layer.self_attn.qkv_proj.qweight
    want = torch.cat(
        [
            hf.model.layers[1].self_attn.get_submodule(n).weight
            for n in ("q_proj", "k_proj", "v_proj")
        ]
    )
    assert torch.equal(qkv.dequantize(), want)
    # e4m3 bytes plus a float32 scale per 128 of them; the 16-bit embeddings and LM head as filed.
    fp8_bytes = sum(t.nbytes for n, t in tensors.items() if t.dtype == torch.float8_e4m3fn)
    held = sum(m.qweight.nbytes for m in _matrices(loaded))
    assert held <= 1.04 * fp8_bytes, (held, fp8_bytes)
    for m in (loaded.model.model.embed_tokens, loaded.model.lm_head):
        assert m.weight is None and m.qweight.formats == ["bf16"]
    file_bytes = os.path.getsize(os.path.join(path, "model.safetensors"))
    assert loaded.weight_bytes <= 1.2 * file_bytes, (loaded.weight_bytes, file_bytes)
    gen = torch.Generator().manual_seed(5)
    for n in (5, 12, 30):
        prompt = torch.randint(3, shape["vocab_size"], (n,), generator=gen).tolist()
        ref, logits = _reference(hf, prompt)
        assert_greedy_equal(_greedy_radixlm(loaded, prompt), (prompt, ref, logits), f"{label} #{n}")


def test_engine_serves_an_fp8_checkpoint_from_its_config(checkpoints):
    """The server path: the checkpoint's method taken unasked, greedy tokens HF's."""
    from radixlm import Engine
    from tests.model.hybrid_checkpoints import tiny_tokenizer

    path, hf, _, _ = checkpoints("qwen3-block")
    tiny_tokenizer().save_pretrained(path)
    prompt = list(range(3, 23))
    ref, logits = _reference(hf, prompt)
    sp = {"max_new_tokens": len(ref), "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, log_level="warning", enable_invariant_checks=True) as engine:
        out = engine.generate(input_ids=prompt, sampling_params=sp)
    assert_greedy_equal(out["output_ids"], (prompt, ref, logits), "engine")


def _config(**weights) -> dict:
    cfg = quantization_config("channel")
    cfg["config_groups"]["group_0"]["weights"].update(weights)
    return cfg


@pytest.mark.parametrize(
    "config, named",
    [
        # pack-quantized: integer weights (quant/compressed_tensors.py), not FP8 ones
        (dict(quantization_config("channel"), format="pack-quantized"), "weights.type 'float'"),
        (dict(quantization_config("channel"), format="nvfp4-pack-quantized"), "format 'nvfp4"),
        (_config(type="int"), "weights.type 'int'"),
        (_config(num_bits=4), "weights.num_bits 4"),
        (_config(strategy="group", group_size=128), "weights.strategy 'group'"),
        (_config(strategy="block", block_structure=[128, 64]), "block_structure [128, 64]"),
        (dict(quantization_config("channel"), kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
    ],
)
def test_unsupported_schemes_are_refused_by_name(config, named):
    with pytest.raises(ValueError, match="quant_method 'compressed-tensors'") as e:
        parse_quantization_config(config)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_scale_of_the_wrong_shape_is_refused_by_name(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _, _, _ = checkpoints("llama-channel")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight_scale"
    tensors[name] = tensors[name][:-1]
    save_file(tensors, tmp_path / "model.safetensors")
    with open(os.path.join(path, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    with pytest.raises(ValueError, match="down_proj.weight: weight_scale \\(127, 1\\)"):
        load_model(str(tmp_path))
