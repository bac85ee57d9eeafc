"""Llama 4's text model (issue 64) from HF safetensors against transformers in float32: chunked
attention on the RoPE layers (chunks of 8 positions, so every prompt and answer crosses several),
a NoPE global layer with attention temperature tuning (floor_scale 4: it scales from position 3
on), L2 q/k norms, interleaved RoPE pairs, the top-1 sigmoid-scaled-input experts with a shared
expert on the MoE layers and a dense MLP on the others; greedy tokens (near-tie rule) alone,
batched and in prefill chunks, on the native kernel's chunked attention."""

from __future__ import annotations

import pytest

from radixlm.model.layers.attention import attention_features
from radixlm.model.loader import load_model
from tests.model.windowed_checkpoints import check_greedy, checkpoint

CHUNK = 8
TINY_LLAMA4 = dict(
    head_dim=16,
    intermediate_size=64,  # an expert's
    intermediate_size_mlp=128,  # the dense layers'
    num_local_experts=4,
    num_experts_per_tok=1,
    interleave_moe_layer_step=2,  # MoE in layers 1 and 3, dense in 0 and 2
    use_qk_norm=True,
    attn_temperature_tuning=True,
    attn_scale=0.1,
    tie_word_embeddings=False,
)


@pytest.fixture(scope="module")
def llama4(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama4"))
    hf = checkpoint(
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        path,
        **TINY_LLAMA4,
        attention_chunk_size=CHUNK,
        floor_scale=4,
    )
    return path, hf


def test_layers_are_llama4s(llama4):
    path, hf = llama4
    assert hf.config.no_rope_layers == [1, 1, 1, 0] and hf.config.moe_layers == [1, 3]
    loaded = load_model(path)
    layers = loaded.model.model.layers
    assert [l.self_attn.attn.attention_chunk_size for l in layers] == [CHUNK] * 3 + [None]
    assert [l.self_attn.use_rope for l in layers] == [True, True, True, False]
    features = attention_features(loaded.model.modules())
    assert features.attention_chunk_size == CHUNK and features.sliding_window_size is None


def test_safetensors_greedy_matches_hf(llama4):
    path, hf = llama4
    check_greedy(path, hf, "llama4")


def test_the_released_multimodal_layout_serves_its_text_model(llama4, tmp_path):
    """Scout / Maverick ship as Llama4ForConditionalGeneration: the same language model under
    `language_model.` beside a vision tower, which the text model skips."""
    import shutil
    from pathlib import Path

    import transformers

    path, hf = llama4
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        vision_output_dim=32,
        projector_input_dim=32,
        projector_output_dim=32,
    )
    cfg = transformers.Llama4Config(text_config=hf.config.to_dict(), vision_config=vision)
    mm = transformers.Llama4ForConditionalGeneration(cfg)  # float32: the default dtype
    mm.language_model.load_state_dict(hf.state_dict())
    out = tmp_path / "mm"
    mm.save_pretrained(out)
    for f in Path(path).iterdir():  # the tiny tokenizer
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    check_greedy(str(out), hf, "llama4 multimodal checkpoint")


def write_llama4_gguf(hf, tokenizer_dir: str, path: str, qtype: str = "f32") -> str:
    """hf as llama.cpp's converter writes it (conversion/llama.py Llama4Model, --outtype qtype):
    its two MLP sizes swapped (feed_forward_length the dense layers', expert_feed_forward_length
    the experts'), interleave_moe_layer_step, q / k in HF's interleaved order (undo_permute off),
    the stacked experts split and transposed to [E, out, in], llama's tensor names. What HF keeps
    in the config (the chunk, the NoPE interval, temperature tuning) it does not write."""
    import gguf

    from tests.model.hybrid_checkpoints import _add_vocab, _stored

    cfg, arch = hf.config, gguf.MODEL_ARCH.LLAMA4
    w = gguf.GGUFWriter(path, "llama4")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size_mlp)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    w.add_file_type(ftype)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_interleave_moe_layer_step(cfg.interleave_moe_layer_step)
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        parts = [(name, t)]
        if name.endswith("experts.gate_up_proj"):  # [E, H, 2I] -> gate, up [E, I, H]
            gate, up = t.transpose(-1, -2).split(t.shape[-1] // 2, dim=-2)
            base = name.removesuffix("gate_up_proj")
            parts = [(base + "gate_proj.weight", gate), (base + "up_proj.weight", up)]
        elif name.endswith("experts.down_proj"):  # [E, I, H] -> [E, H, I]
            parts = [(name + ".weight", t.transpose(-1, -2))]
        for hf_name, tensor in parts:
            gname = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if gname is None:
                raise KeyError(f"no GGUF name for {hf_name}")
            data, dtype = _stored(gname, tensor.float(), ftype, arch)
            w.add_tensor(gname, data, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def llama4_as_llama_cpp(tmp_path_factory):
    """A tiny Llama 4 whose config is what llama.cpp fixes for every llama4 file (chunks of 8,192,
    NoPE every fourth layer, temperature tuning from 8,192, q/k norms with other than 128
    experts), so that the HF reference and the GGUF mean the same model."""
    path = str(tmp_path_factory.mktemp("llama4-gguf"))
    hf = checkpoint(
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        path,
        **TINY_LLAMA4,
        attention_chunk_size=8192,
        floor_scale=8192,
    )
    return path, hf


def test_gguf_config_is_llama_cpps_llama4(llama4_as_llama_cpp, tmp_path):
    from radixlm.model.gguf.loader import gguf_config
    from radixlm.model.gguf.reader import open_gguf

    path, hf = llama4_as_llama_cpp
    f = write_llama4_gguf(hf, path, str(tmp_path / "llama4.gguf"))
    cfg = gguf_config(open_gguf(f))
    assert cfg.architectures == ["Llama4ForCausalLM"]
    for key in (
        "intermediate_size",
        "intermediate_size_mlp",
        "num_local_experts",
        "moe_layers",
        "no_rope_layers",
        "attention_chunk_size",
        "floor_scale",
        "attn_scale",
        "use_qk_norm",
        "head_dim",
    ):
        assert getattr(cfg, key) == getattr(hf.config, key), key


def test_gguf_greedy_matches_hf(llama4_as_llama_cpp, tmp_path):
    path, hf = llama4_as_llama_cpp
    check_greedy(write_llama4_gguf(hf, path, str(tmp_path / "llama4.gguf")), hf, "llama4 gguf")


def test_q8_0_gguf_keeps_its_blocks_and_agrees_with_hf_top1(llama4_as_llama_cpp, tmp_path):
    """A Q8_0 file: q / k rows reordered in their blocks, the experts kept quantized; top-1
    agreement >= 95% with HF holding the file's dequantized weights, along HF's greedy text."""
    import copy

    import torch

    from radixlm.model.gguf.loader import gguf_config, gguf_weights
    from radixlm.model.gguf.reader import open_gguf
    from tests.model.top1_agreement import top1_agreement

    path, hf = llama4_as_llama_cpp
    q8 = write_llama4_gguf(hf, path, str(tmp_path / "llama4-q8_0.gguf"), "q8_0")
    loaded = load_model(q8, quantization="q8_0")
    layers = loaded.model.model.layers
    assert layers[0].self_attn.qkv_proj.qweight.formats == ["q8_0x8"]  # kept in its blocks
    assert layers[1].mlp.w13.quantized and layers[1].mlp.w2.quantized  # the experts too
    reader = open_gguf(q8)
    weights = dict(gguf_weights(reader, gguf_config(reader)))
    held = copy.deepcopy(hf)
    state = held.state_dict()
    for name in list(state):
        ours = name.replace(".feed_forward.router.", ".mlp.gate.").replace(
            ".feed_forward.", ".mlp."
        )
        if name.endswith("experts.gate_up_proj"):
            base = ours.removesuffix("gate_up_proj")
            gate, up = weights[base + "gate_proj.weight"], weights[base + "up_proj.weight"]
            state[name] = torch.cat([gate, up], dim=1).transpose(1, 2)
        elif name.endswith("experts.down_proj"):
            state[name] = weights[ours + ".weight"].transpose(1, 2)
        else:
            state[name] = weights[ours]
    held.load_state_dict(state)
    held.eval()
    agree, total = top1_agreement(q8, hf, held, 800, new_tokens=80)
    assert agree / total >= 0.95, f"llama4 Q8_0: top-1 agreement {agree}/{total}"
