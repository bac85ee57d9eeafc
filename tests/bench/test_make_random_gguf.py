"""benchmarks/make_random_gguf.py: random-weight GGUFs of real shapes. Tiny shapes are written and
loaded (config, tensor types kept quantized, tokenizer); real shapes only through the metadata path
(no large files in tests); llama-quantize is replaced by a stand-in script (not built in CI)."""

from __future__ import annotations

import math
import os
import stat

import numpy as np
import pytest

from benchmarks import make_random_gguf as mrg
from benchmarks.model_shapes import SHAPES

# The real models' parameter counts (their model cards: 1.24B, 1.54B, 8.03B).
REAL_PARAMS = {
    "llama-3.2-1b": 1.24e9,
    "qwen2.5-1.5b": 1.54e9,
    "llama-3-8b": 8.03e9,
    "gpt-oss-20b": 20.91e9,  # the model card's 21B (3.6B active)
    "mistral-small-24b": 23.57e9,  # the 24B model card's text model (24.0B with its vision tower)
    "gemma-3-4b": 3.88e9,  # gemma-3-4b-it's text model (4.3B with its SigLIP tower)
}


@pytest.mark.parametrize("name", list(REAL_PARAMS))
def test_real_shapes_parameter_count(name):
    assert SHAPES[name].num_params() == pytest.approx(REAL_PARAMS[name], rel=0.01)


def test_llama_3_2_1b_plan(capsys):
    s = SHAPES["llama-3.2-1b"]
    assert (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab) == (
        2048,
        16,
        32,
        8,
        64,
        8192,
        128256,
    )
    tensors = {p.name: p for p in mrg.plan(s, "q4_0")}
    assert "output.weight" not in tensors  # tied, as the real one
    assert tensors["token_embd.weight"].shape == (128256, 2048)
    assert tensors["token_embd.weight"].ggml_type.name == "Q8_0"  # the output matrix: not Q4_0
    assert tensors["blk.15.ffn_down.weight"].ggml_type.name == "Q4_0"
    assert tensors["blk.0.attn_norm.weight"].ggml_type.name == "F32"
    assert tensors["rope_freqs.weight"].shape == (32,)
    assert mrg.main(["--shape", "llama-3.2-1b", "--type", "q4_0", "--dry-run"]) == 0
    assert "1,235,814,400" in capsys.readouterr().out


def test_llama3_rope_freqs_match_the_loader():
    # The loader recovers HF's rope_scaling from these factors and refuses anything else.
    from radixlm.model.gguf.loader import _llama3_from_rope_freqs

    s = SHAPES["llama-3.2-1b"]
    factors = mrg.llama3_rope_freqs(s.rope_theta, s.head_dim, s.llama3_rope)
    assert factors.min() == 1.0 and factors.max() == 32.0
    got = _llama3_from_rope_freqs(factors, {"head_dim": s.head_dim, "rope_theta": s.rope_theta})
    assert got == s.llama3_rope


@pytest.mark.parametrize(
    "shape_name,type_name",
    [("tiny", "f16"), ("tiny", "q8_0"), ("tiny", "q4_0"), ("tiny-qwen2", "q4_0")],
)
def test_tiny_file_loads(shape_name, type_name, tmp_path):
    from radixlm import kernels
    from radixlm.model.gguf.reader import open_gguf
    from radixlm.model.loader import load_model, load_tokenizer

    s = SHAPES[shape_name]
    path = str(tmp_path / f"{shape_name}.{type_name}.gguf")
    mrg.make(path, shape_name, type_name, log=None)

    planned = {p.name: p.ggml_type.name for p in mrg.plan(s, type_name)}
    reader = open_gguf(path)
    assert {t.name: t.tensor_type.name for t in reader.tensors} == planned

    loaded = load_model(path, quantization="gguf")
    c = loaded.hf_config
    assert loaded.architecture == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[s.arch]
    assert (
        c.hidden_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.intermediate_size,
        c.vocab_size,
        c.tie_word_embeddings,
        c.max_position_embeddings,
    ) == (
        s.hidden,
        s.layers,
        s.heads,
        s.kv_heads,
        s.head_dim,
        s.intermediate,
        s.vocab,
        s.tied,
        s.context,
    )
    assert c.rope_parameters["rope_theta"] == s.rope_theta
    assert c.rms_norm_eps == pytest.approx(s.rms_eps)
    assert c.rope_parameters.get("rope_type", "default") == (
        "llama3" if s.llama3_rope else "default"
    )

    layer = loaded.model.model.layers[1]
    if s.qkv_bias:
        assert layer.self_attn.qkv_proj.bias is not None and not layer.self_attn.qkv_proj.bias.any()
    norm = layer.input_layernorm.weight.detach()
    assert float(norm.min()) == float(norm.max()) == 1.0
    down = layer.mlp.down_proj
    # CI machines have g++ and AVX2 (tests/kernels/conftest.py): a build failure fails, never skips.
    assert kernels.available(), (
        f"native kernels failed to build/load: {kernels.unavailable_reason()}"
    )
    if type_name == "f16":  # kept 16-bit on the f16 kernels, with the file's values
        assert down.qweight.formats == ["f16"]
        weight = down.qweight.dequantize()
        want = reader.tensors[[t.name for t in reader.tensors].index("blk.1.ffn_down.weight")].data
        assert np.array_equal(weight.numpy(), np.asarray(want, np.float32))
        assert 0.015 < float(weight.std()) < 0.025
    else:  # kept in the file's format (maybe 8-row interleaved: "q4_0x8")
        assert [f.removesuffix("x8") for f in down.qweight.formats] == [type_name]

    tok = load_tokenizer(path)
    assert len(tok) == s.vocab
    text = "Hello world, random weights!"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and max(ids) < 49152
    assert tok.decode([s.vocab - 1]) == f"[PAD{s.vocab - 1}]"  # padding decodes as text


def test_same_seed_same_file(tmp_path):
    a, b, c = (str(tmp_path / f"{n}.gguf") for n in "abc")
    mrg.make(a, "tiny", "q8_0", seed=1, log=None)
    mrg.make(b, "tiny", "q8_0", seed=1, log=None)
    mrg.make(c, "tiny", "q8_0", seed=2, log=None)
    data = [open(p, "rb").read() for p in (a, b, c)]
    assert data[0] == data[1] and data[0] != data[2]


def test_vocab_smaller_than_tokenizer_refused():
    with pytest.raises(ValueError, match="smaller than"):
        mrg.padded_vocab(["a", "b", "c"], [1, 1, 1], 2)


@pytest.mark.parametrize("given", [None, "/nonexistent/llama-quantize"])
def test_missing_llama_quantize(given, tmp_path, capsys):
    out = tmp_path / "x.gguf"
    argv = ["--shape", "tiny", "--type", "q4_k_m", "-o", str(out)] + (
        ["--llama-quantize", given] if given else []
    )
    assert mrg.main(argv) == 2
    err = capsys.readouterr().err
    assert (
        "llama-quantize" in err
        and "build-llama-server.sh" in err
        and "build/bin/llama-quantize" in err
    )
    assert list(tmp_path.iterdir()) == []  # refused before writing the intermediate


def _fake_llama_quantize(tmp_path) -> str:
    # Records its arguments and copies the input to the output, as a successful run would leave one.
    script = tmp_path / "llama-quantize"
    script.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\ncp "$2" "$3"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize("intermediate", [None, "q8_0"])
def test_llama_quantize_call(intermediate, tmp_path):
    from radixlm.model.gguf.reader import open_gguf

    out = str(tmp_path / "tiny.q4_k_m.gguf")
    mrg.make(
        out,
        "tiny",
        "q4_k_m",
        llama_quantize=_fake_llama_quantize(tmp_path),
        intermediate=intermediate,
        log=None,
    )
    args = (tmp_path / "args").read_text().split()
    inter = intermediate or "f16"  # tiny is far below 4B parameters
    assert args == [
        "--allow-requantize",
        f"{out}.{inter}.tmp.gguf",
        out,
        "Q4_K_M",
        str(os.cpu_count()),
    ]
    assert not os.path.exists(args[1])  # the intermediate is removed
    assert open_gguf(out).tensors[1].tensor_type.name == inter.upper()  # [0] is rope_freqs (F32)


# Qwen3.5 hybrids (qwen35 / qwen35moe): the real shapes' text-model sizes, and tiny files loaded.
QWEN35_PARAMS = {
    "qwen3.5-0.8b": 752_393_024,
    "qwen3.5-2b": 1_881_825_088,
    "qwen3.5-35b-a3b": 34_660_610_688,
}


@pytest.mark.parametrize("name", list(QWEN35_PARAMS))
def test_qwen35_real_shapes(name, capsys):
    s = SHAPES[name]
    assert s.num_params() == QWEN35_PARAMS[name]
    tensors = {p.name: p for p in mrg.plan(s, "q8_0")}
    q, kv, h = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.hidden
    key = s.linear_num_key_heads * s.linear_key_head_dim
    value = s.linear_num_value_heads * s.linear_value_head_dim
    assert tensors["blk.3.attn_q.weight"].shape == (2 * q, h)  # layer 3: full attention
    assert tensors["blk.3.attn_k.weight"].shape == (kv, h)
    assert tensors["blk.3.attn_q_norm.weight"].shape == (s.head_dim,)
    assert "blk.3.attn_qkv.weight" not in tensors and "blk.0.attn_q.weight" not in tensors
    assert tensors["blk.0.attn_qkv.weight"].shape == (2 * key + value, h)
    assert tensors["blk.0.ssm_conv1d.weight"].ggml_type.name == "F32"
    assert tensors["blk.0.ssm_a"].shape == (s.linear_num_value_heads,)
    assert ("output.weight" in tensors) == (not s.tied)
    if s.experts:
        assert tensors["blk.0.ffn_gate_exps.weight"].shape == (256, 512, 2048)
        assert tensors["blk.0.ffn_gate_inp.weight"].ggml_type.name == "F32"
    assert mrg.main(["--shape", name, "--type", "q8_0", "--dry-run"]) == 0
    assert f"{QWEN35_PARAMS[name]:,}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "shape_name,type_name", [("tiny-qwen35", "q8_0"), ("tiny-qwen35moe", "q4_0")]
)
def test_tiny_qwen35_file_loads(shape_name, type_name, tmp_path):
    import torch

    from radixlm.model.gguf.fields import field
    from radixlm.model.gguf.reader import open_gguf
    from radixlm.model.loader import load_model

    s = SHAPES[shape_name]
    path = str(tmp_path / f"{shape_name}.gguf")
    mrg.make(path, shape_name, type_name, log=None)
    reader = open_gguf(path)
    assert {t.name: t.tensor_type.name for t in reader.tensors} == {
        p.name: p.ggml_type.name for p in mrg.plan(s, type_name)
    }
    assert field(reader, f"{s.arch}.rope.dimension_count") == 8
    assert field(reader, f"{s.arch}.rope.dimension_sections") == [2, 1, 1, 0]

    loaded = load_model(path, quantization="gguf")
    c = loaded.hf_config
    assert (
        loaded.architecture
        == {
            "qwen35": "Qwen3_5ForCausalLM",
            "qwen35moe": "Qwen3_5MoeForCausalLM",
        }[s.arch]
    )
    assert c.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert (
        c.hidden_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
        c.linear_conv_kernel_dim,
        c.vocab_size,
        c.tie_word_embeddings,
    ) == (
        s.hidden,
        s.layers,
        s.heads,
        s.kv_heads,
        s.head_dim,
        s.linear_num_key_heads,
        s.linear_num_value_heads,
        s.linear_key_head_dim,
        s.linear_value_head_dim,
        s.linear_conv_kernel_dim,
        s.vocab,
        s.tied,
    )
    assert c.rope_parameters["partial_rotary_factor"] == s.partial_rotary_factor
    if s.experts:
        assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (4, 2, 32)
        assert c.shared_expert_intermediate_size == 64
    a_log = dict(loaded.model.named_parameters())["model.layers.0.linear_attn.A_log"].detach()
    assert torch.all((a_log >= 0) & (a_log <= math.log(16.0) + 1e-6))  # ssm_a = -U(1, 16)


def test_tiny_gpt_oss_file_loads_with_mxfp4_experts(tmp_path):
    """The gpt-oss shapes: MXFP4 experts as the released GGUFs store them (random blocks written
    directly), biases and sinks F32, the rest in the asked type; radixlm reads the config back,
    keeps the experts in their MXFP4 blocks (values of about the asked spread) and generates."""
    from radixlm import Engine
    from radixlm.model.gguf.reader import open_gguf
    from radixlm.model.loader import load_model

    s = SHAPES["tiny-gpt-oss"]
    path = str(tmp_path / "tiny-gpt-oss.gguf")
    mrg.make(path, "tiny-gpt-oss", "q8_0", log=None)
    types = {t.name: t.tensor_type.name for t in open_gguf(path).tensors}
    assert types == {p.name: p.ggml_type.name for p in mrg.plan(s, "q8_0")}
    assert types["blk.0.ffn_gate_exps.weight"] == "MXFP4" and types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["blk.0.ffn_gate_exps.bias"] == types["blk.0.attn_sinks.weight"] == "F32"

    loaded = load_model(path)
    c = loaded.hf_config
    assert loaded.architecture == "GptOssForCausalLM"
    assert (c.num_local_experts, c.num_experts_per_tok, c.sliding_window) == (4, 2, 8)
    assert c.layer_types == ["sliding_attention", "full_attention"]
    assert c.rope_parameters["rope_type"] == "yarn" and c.rope_parameters["factor"] == 32.0
    experts = loaded.model.model.layers[1].mlp.experts.fused  # laid out for the fused op
    assert experts["w13"].fmt.name == experts["w2"].fmt.name == "mxfp4x8"
    spread = float(experts["w2"].dequantize().std())
    assert 0.01 < spread < 0.04, spread
    # bench one-batch prices a step's experts (the blocks held outside parameters, and their
    # biases) by the share routed: top-2 of 4, so one token reads half of them, a large batch all.
    from types import SimpleNamespace

    from radixlm.bench.one_batch import bytes_per_step

    pool = SimpleNamespace(
        bytes_per_token=lambda *a: 0, num_layers=0, num_kv_heads=0, head_dim=0, dtype=None
    )
    pool.v_head_dim = 0
    runner = SimpleNamespace(model=loaded.model, token_to_kv_pool=pool)
    experts = [layer.mlp.experts for layer in loaded.model.model.layers]
    held = sum(w.data.nbytes for ex in experts for w in ex.fused.values())
    held += sum(ex.gate_up_proj_bias.nbytes + ex.down_proj_bias.nbytes for ex in experts)
    one, many = bytes_per_step(runner, 1, 0), bytes_per_step(runner, 10_000, 0)
    assert many - one == pytest.approx(held / 2)
    with Engine(model_path=path, log_level="warning", enable_invariant_checks=True) as e:
        out = e.generate("Hello", {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert len(out["output_ids"]) == 8


def test_gemma4_e2b_shape():
    """google/gemma-4-E2B-it's text model: 4.63B parameters of which 2.35B per-layer embeddings
    (looked up, never multiplied: the name's "effective 2B" counts them out), 35 layers of which 7
    global (the last among them), 20 reading earlier layers' KV."""
    s = SHAPES["gemma-4-e2b"]
    ple = s.vocab * s.ple_dim * s.layers
    assert (s.num_params(), ple) == (4_628_569_379, 2_348_810_240)
    assert sum(s.is_global(i) for i in range(s.layers)) == 7 and s.is_global(s.layers - 1)
    assert sum(s.is_shared(i) for i in range(s.layers)) == 20


def test_tiny_gemma4_file_loads(tmp_path):
    """The gemma4 shapes as llama.cpp's converter writes them: radixlm reads the per-layer head
    sizes, KV heads and widths, the pattern, the shared layers and the proportional RoPE back,
    keeps the matrices quantized and generates (window 8: the answer crosses it)."""
    from radixlm import Engine
    from radixlm.model.loader import load_model
    from radixlm.model.memory.kv_layout import kv_layout

    path = str(tmp_path / "tiny-gemma4.gguf")
    mrg.make(path, "tiny-gemma4", "q8_0", log=None)
    loaded = load_model(path)
    c = loaded.hf_config
    assert loaded.architecture == "Gemma4ForCausalLM"
    assert c.layer_types == ["sliding_attention", "full_attention"] * 3
    assert (c.num_kv_shared_layers, c.sliding_window, c.attention_k_eq_v) == (2, 8, True)
    assert c.use_double_wide_mlp and c.intermediate_size == 128
    assert c.rope_parameters["full_attention"]["partial_rotary_factor"] == 0.25
    layout = kv_layout(loaded.model, c)
    assert layout.layer_shapes == ((2, 32), (1, 64), (2, 32), (1, 64), (0, 64), (0, 64))
    layer0 = loaded.model.model.layers[0]
    assert layer0.mlp.gate_up_proj.qweight.formats == ["q8_0x8"]  # kept in its blocks
    assert layer0.self_attn.qkv_proj.qweight.formats == ["q8_0x8"]
    with Engine(model_path=path, log_level="warning", enable_invariant_checks=True) as e:
        out = e.generate("Hello", {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
    assert len(out["output_ids"]) == 12


@pytest.mark.parametrize(
    "shape_name,type_name", [("tiny", "q8_0"), ("tiny-qwen2", "f16"), ("tiny-gpt-oss", "q8_0")]
)
def test_gguf_step_costs_match_the_loaded_model(shape_name, type_name, tmp_path):
    """compare.py --limits prices both engines' steps from the GGUF's tensor table alone; it must
    agree with what bench one-batch counts on the model radixlm builds from the same file: the
    bytes one decode step reads (a mixture's experts at the routed share: top-2 of 4) and, for the
    dense shapes, a prefill's operations."""
    from types import SimpleNamespace

    from radixlm.bench.one_batch import bytes_per_step
    from radixlm.bench.rooflines import gguf_step_costs, prefill_ops
    from radixlm.model.loader import load_model

    path = str(tmp_path / f"{shape_name}.gguf")
    mrg.make(path, shape_name, type_name, log=None)
    costs = gguf_step_costs(path)
    pool = SimpleNamespace(
        bytes_per_token=lambda *a: 0, num_layers=0, num_kv_heads=0, head_dim=0, dtype=None
    )
    pool.v_head_dim = 0
    runner = SimpleNamespace(model=load_model(path).model, token_to_kv_pool=pool)
    # the loader drops a few bytes of 1-D tables it computes itself (tiny's rope factors)
    assert costs.decode_bytes == pytest.approx(bytes_per_step(runner, 1, 0), rel=1e-4)
    if shape_name != "tiny-gpt-oss":  # one-batch's prefill count leaves a mixture's experts out
        assert costs.prefill_ops * 100 + costs.head_ops == prefill_ops(runner, 1, 100)
