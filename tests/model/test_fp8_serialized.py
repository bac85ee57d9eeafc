"""FP8 checkpoints in DeepSeek's / transformers' FineGrainedFP8 layout (quant_method "fp8":
quant/fp8_checkpoint.py): tiny Llama / Qwen3 models quantized here as those releases store them
(e4m3 weights; `weight_scale_inv` per 128 x 128 block, the last block of k/v's 192 rows partial; or
one scale per tensor, vLLM's / SGLang's `weight_scale` with a static `input_scale`, or
transformers' scalar `weight_scale_inv`), the LM head left 16-bit; and a tiny Qwen3-MoE whose
experts stay e4m3 on the fused MoE op. Selected by their config.json alone or by SGLang's
`--quantization fp8`, held as e4m3 (never float) within 1.2x the file, and generating HF's greedy
tokens (float32 on the dequantized weights, near-tie rule)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from radixlm.model.executor.runner_config import ModelRunnerConfig
from radixlm.model.loader import load_model
from radixlm.model.quant.checkpoint import parse_quantization_config
from radixlm.model.quant.methods import refusal
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.moe_checkpoints import hf_model
from tests.model.test_awq_gptq import LINEARS, _greedy_radixlm, _reference, checkpoint_cache
from tests.model.test_fp8_checkpoint import assert_fp8_model_is_hf, fp8_quantize, write_checkpoint

# 6 heads of 64 (q: 384 rows) and 3 KV heads (k, v: 192 rows, a 128-row block and a partial one);
# every input size whole 128-value blocks, as the FP8 kernel needs.
SHAPE = dict(
    vocab_size=256,
    hidden_size=384,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
CASES = {  # key: (architecture, strategy, scale tensor's name, extra quantization_config)
    # DeepSeek-V3's and Qwen3-*-FP8's layout (DeepSeek's config also spells fmt).
    "llama-block": ("llama", "block", "weight_scale_inv", dict(fmt="e4m3")),
    "qwen3-block": ("qwen3", "block", "weight_scale_inv", dict(modules_to_not_convert=None)),
    # vLLM's / SGLang's per-tensor serialization, static activations (input_scale: read past).
    "llama-tensor": ("llama", "tensor", "weight_scale", dict(activation_scheme="static")),
    # transformers' FineGrainedFP8 without blocks: a scalar weight_scale_inv; MiniMax's spelling.
    "qwen3-tensor": ("qwen3", "tensor", "weight_scale_inv", dict(ignored_layers=["lm_head"])),
}


def fp8_config(strategy: str, **extra) -> dict:
    cfg = dict(quant_method="fp8", activation_scheme="dynamic", modules_to_not_convert=["lm_head"])
    if strategy == "block":
        cfg["weight_block_size"] = [128, 128]
    return {**cfg, **extra}


def write_fp8(path: str, key: str):
    arch, strategy, scale_name, extra = CASES[key]
    return write_checkpoint(
        path,
        arch,
        strategy,
        shape=SHAPE,
        scale_name=scale_name,
        config=fp8_config(strategy, **extra),
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, native_kernels_built):
    assert native_kernels_built, "the native kernels failed to build"
    return checkpoint_cache(tmp_path_factory, lambda path, key: write_fp8(path, key))


@pytest.mark.parametrize("key", list(CASES))
def test_checkpoint_loads_fp8_and_generates_hf_greedy(checkpoints, key):
    path, hf, tensors, loaded = checkpoints(key)
    assert loaded.quantization == "fp8_serialized"  # from config.json alone
    assert_fp8_model_is_hf(path, hf, tensors, loaded, key, SHAPE)


def test_quantization_fp8_selects_the_checkpoint_on_the_cpu(checkpoints, tmp_path, monkeypatch):
    """SGLang's `--quantization fp8` for an FP8 checkpoint: its weights, not the CUDA method that
    quantizes float ones (still refused on the CPU for a float checkpoint); another checkpoint
    method is refused naming the checkpoint's."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the tests' CPU stand-in for CUDA
    path, _, _, _ = checkpoints("llama-block")
    assert refusal("fp8", "cpu", path) is None
    ModelRunnerConfig(model_path=path, quantization="fp8")  # not refused at start-up
    assert load_model(path, quantization="fp8").quantization == "fp8_serialized"
    with pytest.raises(ValueError, match="quant_method 'fp8'.* pass fp8$"):
        load_model(path, quantization="compressed-tensors")
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    del config["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    for where in (str(tmp_path), None):  # not an FP8 checkpoint: fp8 is the CUDA method
        with pytest.raises(ValueError, match="^--quantization fp8 is CUDA-only"):
            ModelRunnerConfig(model_path=where, quantization="fp8")


def test_engine_serves_it_with_quantization_fp8(checkpoints):
    """The server path with SGLang's flag (ServerArgs, the start-up checks, the scheduler's
    load): greedy tokens HF's."""
    from radixlm import Engine
    from tests.model.hybrid_checkpoints import tiny_tokenizer

    path, hf, _, _ = checkpoints("qwen3-block")
    tiny_tokenizer().save_pretrained(path)
    prompt = list(range(3, 23))
    ref, logits = _reference(hf, prompt)
    sp = {"max_new_tokens": len(ref), "temperature": 0, "ignore_eos": True}
    with Engine(
        model_path=path, quantization="fp8", log_level="warning", enable_invariant_checks=True
    ) as engine:
        out = engine.generate(input_ids=prompt, sampling_params=sp)
    assert_greedy_equal(out["output_ids"], (prompt, ref, logits), "engine")


@pytest.mark.parametrize(
    "changes, named",
    [
        (dict(fmt="e5m2"), "fmt 'e5m2'"),
        (dict(activation_scheme="static"), "activation_scheme 'static'"),  # with block scales
        (dict(activation_scheme="per-token"), "activation_scheme 'per-token'"),
        (dict(weight_block_size=[128, 64]), "weight_block_size [128, 64]"),
        (dict(weight_block_size=[1, 32]), "weight_block_size [1, 32]"),
        (dict(kv_cache_quant_algo="FP8"), "kv_cache_quant_algo 'FP8'"),
        (dict(modules_to_convert=["embed_tokens"]), "modules_to_convert ['embed_tokens']"),
        (dict(expert_dtype="fp4"), "expert_dtype 'fp4'"),
        (dict(scale_fmt="e8m0x4"), "scale_fmt 'e8m0x4'"),
    ],
)
def test_unsupported_settings_are_refused_by_name(changes, named):
    with pytest.raises(ValueError, match="quant_method 'fp8'") as e:
        parse_quantization_config(fp8_config("block", **changes))
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_scale_of_the_wrong_shape_is_refused_by_name(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    path, _, _, _ = checkpoints("llama-block")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    name = "model.layers.0.self_attn.k_proj.weight_scale_inv"
    tensors[name] = tensors[name][:1]  # k's 192 rows take two row blocks
    save_file(tensors, tmp_path / "model.safetensors")
    with open(os.path.join(path, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    with pytest.raises(ValueError, match="k_proj.weight: weight_scale_inv \\(1, 3\\) does not fit"):
        load_model(str(tmp_path))


def write_fp8_moe(path: str):
    """A tiny Qwen3-MoE (8 experts of 128, layer 1 dense) in Qwen3-30B-A3B-FP8's layout: every
    expert's gate / up / down e4m3 with 128 x 128 block scales, one tensor each as
    save_pretrained writes them; the router, embeddings and LM head bf16. HF's model (it holds
    the experts stacked) gets the dequantized weights: the reference."""
    from safetensors.torch import save_file

    hf = hf_model(
        "qwen3_moe", hidden_size=128, head_dim=32, moe_intermediate_size=128, intermediate_size=256
    )
    inter, tensors = hf.config.moe_intermediate_size, {}
    with torch.no_grad():
        hf.lm_head.weight.mul_(8)  # logits of a real model's spread: greedy choices off ties
        for name, p in hf.named_parameters():
            p.copy_(p.bfloat16().float())
            prefix, _, kind = name.rpartition(".")
            if prefix.endswith(".experts"):  # [E, rows, cols]
                halves = (("gate_proj", 0), ("up_proj", inter)) if kind == "gate_up_proj" else None
                for e in range(p.shape[0]):
                    for proj, w in (
                        [(proj, p[e, r : r + inter]) for proj, r in halves]
                        if halves
                        else [("down_proj", p[e])]
                    ):
                        q, scale, deq = fp8_quantize(w, "block")
                        tensors[f"{prefix}.{e}.{proj}.weight"] = q
                        tensors[f"{prefix}.{e}.{proj}.weight_scale_inv"] = scale
                        w.copy_(deq)
            elif kind == "weight" and prefix.rpartition(".")[2] in LINEARS:
                q, scale, deq = fp8_quantize(p, "block")
                tensors[name], tensors[prefix + ".weight_scale_inv"] = q, scale
                p.copy_(deq)
            else:
                tensors[name] = p.detach().bfloat16()
    hf.config.save_pretrained(path)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = fp8_config("block")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return hf


def test_moe_experts_stay_fp8_on_the_fused_kernel(tmp_path, native_kernels_built):
    from radixlm.model.layers.moe import native

    assert native_kernels_built, "the native kernels failed to build"
    hf = write_fp8_moe(str(tmp_path))
    loaded = load_model(str(tmp_path))
    assert loaded.quantization == "fp8_serialized"
    block, ref = loaded.model.model.layers[0].mlp, hf.model.layers[0].mlp.experts
    for w in (block.w13, block.w2):
        assert w.fmt.name == "fp8_e4m3"  # stacked, never float
    assert block._experts is native.run  # the fused MoE op reads them as they are
    assert torch.equal(block.w13.dequantize(), ref.gate_up_proj)
    assert torch.equal(block.w2.dequantize(), ref.down_proj)
    assert loaded.model.model.layers[1].mlp.gate_up_proj.qweight.formats == ["fp8_e4m3"]
    file_bytes = os.path.getsize(tmp_path / "model.safetensors")
    assert loaded.weight_bytes <= 1.2 * file_bytes, (loaded.weight_bytes, file_bytes)
    gen = torch.Generator().manual_seed(5)
    for n in (5, 12, 30):
        prompt = torch.randint(3, hf.config.vocab_size, (n,), generator=gen).tolist()
        ref_ids, logits = _reference(hf, prompt)
        assert_greedy_equal(_greedy_radixlm(loaded, prompt), (prompt, ref_ids, logits), f"#{n}")


def test_fp8_experts_of_another_moe_are_refused_by_name(tmp_path):
    """DeepSeek-V3's MoE takes float or GGUF experts: its FP8 release is refused at its first
    expert, in one line naming the tensor and the architecture."""
    from safetensors.torch import save_file

    from tests.model.deepseek_refs import CONFIGS

    cfg = CONFIGS["v3"]()
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    config = {**cfg.to_dict(), "quantization_config": fp8_config("block")}
    (tmp_path / "config.json").write_text(json.dumps(config))
    name = "model.layers.1.mlp.experts.0.gate_proj"
    q = torch.zeros(cfg.moe_intermediate_size, cfg.hidden_size, dtype=torch.float8_e4m3fn)
    save_file(
        {f"{name}.weight": q, f"{name}.weight_scale_inv": torch.ones(1, 1)},
        tmp_path / "model.safetensors",
    )
    with pytest.raises(ValueError) as e:
        load_model(str(tmp_path))
    assert str(e.value).startswith(f"{name}.weight: FP8 experts are not supported for Deepseek")
    assert "\n" not in str(e.value)
