"""gpt-oss with MXFP4 experts (issue 64), as llama.cpp's GGUFs of the released models store them and
as the released HF checkpoints do (quant_method "mxfp4"): the experts stay in MXFP4 blocks and run
on the native MXFP4 kernel (kernels/csrc/quant_gguf.cpp; tests/kernels/test_quant_gemm.py checks it
against gguf's dequantizer), never as float copies; the blocks decode to exactly what gguf.quants
(GGUF) or transformers' own MXFP4 decoder (HF) decode; and the engine's greedy tokens are those of
HF's model on those dequantized experts (near-tie rule of the int8 activation grid, as
tests/model/test_awq_gptq.py)."""

from __future__ import annotations

import copy
import random

import gguf
import pytest
import torch
from gguf.quants import dequantize

from radixlm import Engine
from radixlm.model.loader import load_model
from tests.model.gpt_oss_checkpoint import gpt_oss_checkpoint, write_gguf
from tests.model.test_awq_gptq import NEAR_TIE
from tests.model.windowed_checkpoints import VOCAB, reference

NEW = 16


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gpt_oss_mxfp4"))
    hf = gpt_oss_checkpoint(path)
    gguf_path = write_gguf(hf, path, f"{path}/mxfp4.gguf", experts="MXFP4")
    return gguf_path, hf, _dequantized_experts(hf, gguf_path)


def _dequantized_experts(hf, gguf_path: str):
    """HF's model with each expert weight replaced by what gguf.quants decodes from the file."""
    reader = gguf.GGUFReader(gguf_path)
    file = {t.name: dequantize(t.data, t.tensor_type) for t in reader.tensors}
    ref = copy.deepcopy(hf)
    with torch.no_grad():
        for i, layer in enumerate(ref.model.layers):
            ex = layer.mlp.experts
            gate = torch.from_numpy(file[f"blk.{i}.ffn_gate_exps.weight"].copy())
            up = torch.from_numpy(file[f"blk.{i}.ffn_up_exps.weight"].copy())
            down = torch.from_numpy(file[f"blk.{i}.ffn_down_exps.weight"].copy())
            gate_up = torch.stack((gate, up), dim=2).flatten(1, 2)  # rows gate, up, gate, ...
            ex.gate_up_proj.copy_(gate_up.transpose(1, 2))
            ex.down_proj.copy_(down.transpose(1, 2))
    return ref


def test_experts_stay_mxfp4_and_decode_to_the_file(mxfp4):
    gguf_path, _, ref = mxfp4
    loaded = load_model(gguf_path)
    for i, layer in enumerate(loaded.model.model.layers):
        _assert_experts_are(layer.mlp.experts, ref.model.layers[i].mlp.experts)


def _assert_experts_are(ex, want) -> None:
    """The loaded experts hold no float copy and are laid out for the native fused_moe op (w13 =
    [gate; up] rows, 8 rows interleaved, MXFP4 blocks), decoding to HF's `want` exactly."""
    assert ex.gate_up_proj.numel() == 0 and ex.down_proj.numel() == 0
    w13, w2 = ex.fused["w13"], ex.fused["w2"]
    assert w13.fmt.name == "mxfp4x8" and w2.fmt.name == "mxfp4x8"
    gate_up = want.gate_up_proj.transpose(1, 2)  # [E, 2I, H], rows gate, up, gate, ...
    assert torch.equal(w13.dequantize(), torch.cat((gate_up[:, ::2], gate_up[:, 1::2]), 1))
    assert torch.equal(w2.dequantize(), want.down_proj.transpose(1, 2))
    bias = want.gate_up_proj_bias
    assert torch.equal(ex.fused_bias["b13"], torch.cat((bias[:, ::2], bias[:, 1::2]), 1))
    assert torch.equal(ex.fused_bias["b2"], want.down_proj_bias)


def test_greedy_tokens_are_hf_on_the_dequantized_experts(mxfp4):
    gguf_path, _, ref = mxfp4
    rng = random.Random(11)
    prompts = [[rng.randrange(10, VOCAB) for _ in range(n)] for n in (6, 21, 40)]
    sp = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=gguf_path, enable_invariant_checks=True, log_level="warning") as e:
        outs = [e.generate(input_ids=p, sampling_params=sp)["output_ids"] for p in prompts]
        batched = [o["output_ids"] for o in e.generate(input_ids=prompts, sampling_params=sp)]
    assert batched == outs  # the native kernels give a token the same bits in any batch
    _assert_hf_greedy(ref, prompts, outs)


def _assert_hf_greedy(ref, prompts: list[list[int]], outs: list[list[int]]) -> None:
    """HF's greedy tokens up to a near-tie of the int8 activation grid; near-ties end a comparison
    early, so most tokens must still have been compared."""
    matched = 0
    assert len(outs) == len(prompts)
    for p, got in zip(prompts, outs):
        _, gen, logits = reference(ref, p, NEW)
        assert len(got) == len(gen) == NEW, (len(got), len(gen))
        for k, (a, b) in enumerate(zip(got, gen)):
            if a != b:
                top2 = torch.topk(logits[k], 2).values
                gap = (top2[0] - top2[1]).item()
                assert gap < NEAR_TIE, f"prompt {len(p)}: token {k} is {a}, HF's {b}, gap {gap:.3g}"
                break
            matched += 1
    assert matched >= NEW * len(prompts) // 2, matched


# ---- gpt-oss's released layout: HF safetensors with quantization_config quant_method "mxfp4" ----

FP4 = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def _to_hf_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [E, rows, cols] -> (blocks uint8 [E, rows, cols / 32, 16], scales uint8 [E, rows,
    cols / 32]) as the OCP MX spec and OpenAI's release pack them: an e8m0 exponent per 32 values
    (2^(s - 127), the largest value's power of two less 2), each value the nearest e2m1 times it,
    two a byte with the lower-indexed value in the low nibble."""
    E, rows, cols = w.shape
    g = w.reshape(E, rows, cols // 32, 32)
    amax = g.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.zeros_like(amax))
    scaled = g / torch.exp2(exp)[..., None]
    codes = (scaled[..., None] - FP4).abs().argmin(-1).to(torch.uint8)  # [E, rows, G, 32]
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exp + 127).to(torch.uint8)


@pytest.fixture(scope="module")
def hf_mxfp4(tmp_path_factory):
    """A tiny gpt-oss saved in the released layout (16-bit elsewhere), and HF's float model of it:
    the experts as transformers' own MXFP4 decoder reads them, the rest the bfloat16 values."""
    import json

    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    path = str(tmp_path_factory.mktemp("gpt_oss_hf_mxfp4"))
    hf = gpt_oss_checkpoint(path)
    ref = copy.deepcopy(hf)
    tensors = {}
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(torch.bfloat16).float())  # what a bfloat16 checkpoint holds
        for i, layer in enumerate(ref.model.layers):
            ex = layer.mlp.experts
            for proj in ("gate_up_proj", "down_proj"):
                blocks, scales = _to_hf_mxfp4(getattr(ex, proj).transpose(1, 2).float())
                prefix = f"model.layers.{i}.mlp.experts.{proj}"
                tensors[prefix + "_blocks"], tensors[prefix + "_scales"] = blocks, scales
                deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
                getattr(ex, proj).copy_(deq)  # HF's own decoding of the packed experts
    for name, t in ref.state_dict().items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = t.to(torch.bfloat16).contiguous()
    save_file(tensors, f"{path}/model.safetensors")
    cfg = json.load(open(f"{path}/config.json"))
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"],
    }
    json.dump(cfg, open(f"{path}/config.json", "w"))
    return path, ref


def test_hf_mxfp4_checkpoint_loads_in_its_blocks(hf_mxfp4):
    import os

    path, ref = hf_mxfp4
    loaded = load_model(path)  # quant_method mxfp4 selects the method
    for i, layer in enumerate(loaded.model.model.layers):
        _assert_experts_are(layer.mlp.experts, ref.model.layers[i].mlp.experts)
    file_bytes = os.path.getsize(os.path.join(path, "model.safetensors"))
    experts = sum(
        sum(w.data.numel() for w in (layer.mlp.experts.fused["w13"], layer.mlp.experts.fused["w2"]))
        for layer in loaded.model.model.layers
    )
    assert experts <= loaded.weight_bytes <= 1.2 * file_bytes, (experts, loaded.weight_bytes)


def test_hf_mxfp4_greedy_tokens_are_hf(hf_mxfp4):
    path, ref = hf_mxfp4
    rng = random.Random(13)
    prompts = [[rng.randrange(10, VOCAB) for _ in range(n)] for n in (7, 25)]
    sp = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, enable_invariant_checks=True, log_level="warning") as e:
        outs = [e.generate(input_ids=p, sampling_params=sp)["output_ids"] for p in prompts]
    _assert_hf_greedy(ref, prompts, outs)


def test_a_scheme_we_do_not_read_is_refused_by_name():
    from radixlm.model.quant.checkpoint import parse_quantization_config

    with pytest.raises(ValueError, match="quant_method 'bitsandbytes' is not supported"):
        parse_quantization_config({"quant_method": "bitsandbytes"})
