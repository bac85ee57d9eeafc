"""FP8 checkpoints in DeepSeek's / transformers' FineGrainedFP8 layout (quant_method "fp8":
model/fp8_checkpoint.py): tiny Llama / Qwen3 models quantized here as those releases store them
(e4m3 weights; `weight_scale_inv` per 128 x 128 block, the last block of k/v's 192 rows partial; or
one scale per tensor, vLLM's / SGLang's `weight_scale` with a static `input_scale`, or
transformers' scalar `weight_scale_inv`), the LM head left 16-bit. Selected by their config.json
alone or by SGLang's `--quantization fp8`, held as e4m3 (never float) within 1.2x the file, and
generating HF's greedy tokens (float32 on the dequantized weights, near-tie rule)."""

from __future__ import annotations

import json
import os

import pytest

from radixlm.model.loader import load_model
from radixlm.model.quant_checkpoint import parse_quantization_config
from radixlm.model.quant_methods import refusal
from radixlm.model.runner_config import ModelRunnerConfig
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.test_awq_gptq import _reference
from tests.model.test_fp8_checkpoint import assert_fp8_model_is_hf, write_checkpoint

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
    made: dict[str, tuple] = {}

    def get(key: str):
        if key not in made:
            path = str(tmp_path_factory.mktemp(key))
            hf, tensors = write_fp8(path, key)
            made[key] = path, hf, tensors, load_model(path)
        return made[key]

    return get


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
