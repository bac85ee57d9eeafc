"""llm-compressor's integer checkpoints (quant/compressed_tensors.py): tiny random Llama / Qwen3
models quantized and written by the compressed-tensors library itself (its presets W4A16,
W4A16_ASYM, W8A16, W8A8; min-max scales from its own calculate_qparams; its ModelCompressor
packing and config.json), selected by their config.json alone, held in their own bit width on the
native kernels (never float) within 1.2x the file, each matrix the library's own dequantized
weight, and generating HF's greedy tokens (float32 on those weights; the kernels' int8 activation
rows' near-tie rule, test_awq_gptq.py's) through prefill and decode."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass

import pytest
import torch
import transformers

from radixlm.model.layers.quantized import QuantizedMatrix
from radixlm.model.quant.checkpoint import parse_quantization_config
from tests.model.helpers import PoolHarness, randomize
from tests.model.test_awq_gptq import (
    LINEARS,
    NEW,
    REL_TOL,
    SHAPE,
    _greedy_matches,
    _greedy_radixlm,
    _matrices,
    _reference,
    checkpoint_cache,
)
from tests.model.test_gguf_mixed_quants import on_kernel_grids


@dataclass(frozen=True)
class Case:
    preset: str  # compressed-tensors' preset scheme
    weights: tuple = ()  # overrides of its weight args
    acts: tuple = ()  # and of its input activations' (W8A8)
    arch: str = "llama"
    fmt: str = "q4_0x8"  # what the native kernels hold
    file_format: str = "pack-quantized"


CASES = {
    "w4a16-g128": Case("W4A16"),
    "w4a16-g64": Case("W4A16", (("group_size", 64),), arch="qwen3"),
    "w4a16-asym-g64": Case("W4A16_ASYM", (("group_size", 64),), fmt="q4_1x8"),
    "w4a16-asym-channel": Case(
        "W4A16_ASYM", (("strategy", "channel"), ("group_size", None)), fmt="q4_1x8"
    ),
    "w8a16-g128": Case("W8A16", fmt="q8_0x8"),
    "w8a8": Case("W8A8", arch="qwen3", fmt="q8_0x8", file_format="int-quantized"),
    # One weight scale per tensor and static activation scales (input_scale, read past).
    "w8a8-static-tensor": Case(
        "W8A8",
        (("strategy", "tensor"),),
        (("strategy", "tensor"), ("dynamic", False)),
        fmt="q8_0x8",
        file_format="int-quantized",
    ),
}


def write_checkpoint(path: str, case: Case, seed: int = 0):
    """The library's checkpoint of a random bf16 model at path, and HF's float32 model on the
    library's own dequantization of it (float32 scales: (q - z) * s unrounded), the reference."""
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import load_file

    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[case.arch]
    cfg = cls(**SHAPE)
    cfg.architectures = [cls.__name__.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    randomize(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # logits of a real model's spread: greedy choices off ties
    model = model.to(torch.bfloat16)  # as llm-compressor's inputs are
    preset = dict(PRESET_SCHEMES[case.preset])
    preset["weights"] = args = preset["weights"].model_copy(update=dict(case.weights))
    if case.acts:
        preset["input_activations"] = preset["input_activations"].model_copy(update=dict(case.acts))
    scheme = QuantizationScheme(targets=["Linear"], **preset)
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    )
    with torch.no_grad():  # what llm-compressor's min-max observer leaves (RTN)
        for module in model.modules():
            if hasattr(module, "weight_scale"):
                w = module.weight.float()
                if args.strategy == "tensor":
                    lo, hi = w.amin(), w.amax()
                else:
                    per = args.group_size if args.strategy == "group" else w.shape[1]
                    w = w.reshape(len(w), -1, per)
                    lo, hi = w.amin(-1), w.amax(-1)
                scale, zero = calculate_qparams(lo, hi, args)
                module.weight_scale.copy_(scale)
                if hasattr(module, "weight_zero_point"):
                    module.weight_zero_point.copy_(zero.round())
                if hasattr(module, "input_scale"):  # a static scale: unused on the CPU
                    module.input_scale.fill_(0.05)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["quantization_config"]["format"] == case.file_format
    # The reference: every layer as the library decompresses it, the rest as filed.
    tensors = load_file(os.path.join(path, "model.safetensors"))
    codec = BaseCompressor.load_from_registry(case.file_format)
    state: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        prefix, _, kind = name.rpartition(".")
        if prefix.rpartition(".")[2] not in LINEARS:
            state[name] = t.float()
        elif kind == "weight_scale":
            local = {k.rpartition(".")[2]: v for k, v in tensors.items() if k.startswith(prefix)}
            local["weight_scale"] = local["weight_scale"].float()
            state[prefix + ".weight"] = codec.decompress(local, scheme)["weight"].float()
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    hf.load_state_dict(state)
    return hf, tensors


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, native_kernels_built):
    assert native_kernels_built, "the native kernels failed to build"
    return checkpoint_cache(tmp_path_factory, lambda path, key: write_checkpoint(path, CASES[key]))


@pytest.mark.parametrize("key", list(CASES))
def test_checkpoint_loads_in_its_bit_width_and_generates_hf_greedy(checkpoints, key):
    path, hf, tensors, loaded = checkpoints(key)
    case = CASES[key]
    assert loaded.quantization == "compressed-tensors"  # from config.json alone
    for m in _matrices(loaded):
        assert m.weight is None, "a float weight is held"
        assert isinstance(m.qweight, QuantizedMatrix) and m.qweight.formats == [case.fmt]
    # Each matrix holds the library's dequantized weight: exactly (Q4_0, Q8_0: a bf16 scale is
    # exact in f16), or but for Q4_1's min -s*z rounded to f16.
    for i, layer in enumerate(loaded.model.model.layers):
        theirs = hf.model.layers[i]
        pairs = (
            (
                layer.self_attn.qkv_proj,
                [theirs.self_attn.get_submodule(n + "_proj") for n in "qkv"],
            ),
            (layer.mlp.down_proj, [theirs.mlp.down_proj]),
        )
        for mine, refs in pairs:
            want = torch.cat([r.weight for r in refs])
            tol = 0 if case.fmt != "q4_1x8" else 1e-3 * want.abs().max().item()
            assert (mine.qweight.dequantize() - want).abs().max().item() <= tol, (key, i)
    # Resident weights in their own bit width: the 8-row interleaved blocks the loader keeps hold
    # 4.5 bits a symmetric 4-bit weight (Q4_0X8: a scale per 32), 5 an asymmetric one (Q4_1X8: scale
    # and min) and 8.5 bits an 8-bit one, against the file's 4 + 16/128 (g128) to 4 + 20/64 (g64
    # with zeros) and 8 + 16/in bits; the whole model within 1.2x the file (the embeddings and the
    # LM head stay bf16).
    count = sum(m.qweight.rows * m.qweight.cols for m in _matrices(loaded))
    held = sum(m.qweight.nbytes for m in _matrices(loaded))
    bits = {"q8_0x8": 8.5, "q4_1x8": 5.0, "q4_0x8": 4.5}[case.fmt]
    assert 8 * held / count == bits, (held, count)
    for m in (loaded.model.model.embed_tokens, loaded.model.lm_head):
        assert m.weight is None and m.qweight.formats == ["bf16"]
    file_bytes = os.path.getsize(os.path.join(path, "model.safetensors"))
    assert loaded.weight_bytes <= 1.2 * file_bytes, (loaded.weight_bytes, file_bytes)
    gen, matched, lengths = torch.Generator().manual_seed(5), 0, (6, 24)
    for n in lengths:
        prompt = torch.randint(3, SHAPE["vocab_size"], (n,), generator=gen).tolist()
        ref, logits = _reference(hf, prompt)
        matched += _greedy_matches(_greedy_radixlm(loaded, prompt), ref, logits, f"{key} #{n}")
    assert matched >= NEW * len(lengths) // 2, matched  # near-ties end a comparison early


@pytest.mark.parametrize("key", ["w4a16-asym-g64", "w8a8"])
def test_each_matrix_is_the_checkpoints_product(checkpoints, key):
    """On the inputs each projection receives in the model's forward: its output is the float
    product of its dequantized weights with the input on the kernels' int8 grid."""
    _, _, _, loaded = checkpoints(key)
    seen = []
    hooks = [
        m.register_forward_hook(lambda m, a, out: seen.append((m, a[0].clone(), out.clone())))
        for m in _matrices(loaded)
    ]
    try:
        h = PoolHarness(loaded.model, loaded.hf_config)
        h.extend([h.new_request()], [list(range(3, 40))])
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen) == 4 * SHAPE["num_hidden_layers"]
    for m, x, out in seen:
        want = on_kernel_grids(m.qweight, x, m.qweight.dequantize())
        rel = (out - want).abs().max().item() / want.abs().max().item()
        assert rel < REL_TOL, (key, rel)


def test_engine_serves_a_w4a16_checkpoint_from_its_config(checkpoints):
    """The server path, two prompts batched: the checkpoint's method taken unasked, greedy tokens
    HF's."""
    from radixlm import Engine
    from tests.model.hybrid_checkpoints import tiny_tokenizer

    path, hf, _, _ = checkpoints("w4a16-g128")
    tiny_tokenizer().save_pretrained(path)
    # (range(3, 23)'s second token is a 0.02 near-tie in HF's logits: these two are not.)
    prompts = [list(range(5, 25)), list(range(40, 60))]
    sp = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, log_level="warning", enable_invariant_checks=True) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=sp)
    assert len(outs) == len(prompts)
    for prompt, out in zip(prompts, outs):
        ref, logits = _reference(hf, prompt)
        assert _greedy_matches(out["output_ids"], ref, logits, "engine") >= NEW // 2


def _config(fmt: str = "pack-quantized", **weights) -> dict:
    w = dict(
        num_bits=4, type="int", symmetric=True, dynamic=False, strategy="group", group_size=128
    )
    w.update(weights)
    return dict(
        quant_method="compressed-tensors",
        format=fmt,
        config_groups={"group_0": dict(targets=["Linear"], weights=w)},
        ignore=["lm_head"],
    )


@pytest.mark.parametrize(
    "config, named",
    [
        (_config("nvfp4-pack-quantized"), "format 'nvfp4-pack-quantized'"),
        (_config(num_bits=2), "weights.num_bits 2"),
        (_config(type="float"), "weights.type 'float'"),
        (_config(num_bits=8, symmetric=False), "weights.symmetric False"),
        (_config(strategy="block"), "weights.strategy 'block'"),
        (_config(group_size=48), "group_size 48"),
        (_config(dynamic=True), "weights.dynamic True"),
        (dict(_config(), kv_cache_scheme={"num_bits": 8}), "kv_cache_scheme"),
        (dict(_config(), transform_config={"config_groups": {"u": {}}}), "transform_config"),
    ],
)
def test_unsupported_schemes_are_refused_by_name(config, named):
    with pytest.raises(ValueError, match="quant_method 'compressed-tensors'") as e:
        parse_quantization_config(config)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_a_scale_of_the_wrong_shape_is_refused_by_name(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    from radixlm.model.loader import load_model

    path, _, _, _ = checkpoints("w4a16-g64")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight_scale"
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, tmp_path / "model.safetensors")
    with open(os.path.join(path, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    with pytest.raises(ValueError, match=r"down_proj.weight: weight_scale \(128, 3\)"):
        load_model(str(tmp_path))


def test_an_act_order_checkpoint_permutes_its_input(checkpoints, tmp_path):
    """actorder "group" (GPTQ's act-order; compressed-tensors before 0.20 wrote it): each layer's
    `weight_g_idx` maps its input columns to groups out of order. Made here from the library's
    W4A16 g64 checkpoint by permuting each input's columns (one permutation per input: q/k/v and
    gate/up share theirs), the codes repacked with the library's own pack_to_int32; HF's model
    holds the permuted dequantized weights."""
    from compressed_tensors.compressors.pack_quantized.helpers import (
        pack_to_int32,
        unpack_from_int32,
    )
    from safetensors.torch import save_file

    from radixlm.model.layers.permuted_matrix import PermutedInputMatrix
    from radixlm.model.loader import load_model

    path, hf, tensors, _ = checkpoints("w4a16-g64")
    hf = copy.deepcopy(hf)  # the module's reference stays the unpermuted model's
    gen, perms = torch.Generator().manual_seed(3), {}
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    out = dict(tensors)
    for name, packed in tensors.items():
        prefix, _, kind = name.rpartition(".")
        if kind != "weight_packed":
            continue
        shape = tensors[prefix + ".weight_shape"]
        key = (prefix.rsplit(".", 1)[0], prefix.endswith(("o_proj", "down_proj")))
        perm = perms.setdefault(key, torch.randperm(int(shape[1]), generator=gen))
        q = unpack_from_int32(packed, 4, torch.Size(shape.tolist()))
        out[name] = pack_to_int32(q[:, perm].contiguous(), 4)
        out[prefix + ".weight_g_idx"] = (perm // 64).to(torch.int32)
        state[prefix + ".weight"] = state[prefix + ".weight"][:, perm]
    hf.load_state_dict(state)
    save_file(out, tmp_path / "model.safetensors")
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load_model(str(tmp_path))
    for m in _matrices(loaded):
        assert isinstance(m.qweight, PermutedInputMatrix) and m.qweight.inner.formats == ["q4_0x8"]
    matched, gen = 0, torch.Generator().manual_seed(5)
    for n in (7, 20):
        prompt = torch.randint(3, SHAPE["vocab_size"], (n,), generator=gen).tolist()
        ref, logits = _reference(hf, prompt)
        matched += _greedy_matches(_greedy_radixlm(loaded, prompt), ref, logits, f"act-order #{n}")
    assert matched >= NEW, matched
