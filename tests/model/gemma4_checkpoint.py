"""A tiny random float32 Gemma 4 checkpoint (HF Gemma4ForCausalLM) for the model and cache tests:
6 layers alternating sliding (window WINDOW, 16-dim heads over 2 KV heads) and global attention
(32-dim heads over 1 KV head, proportional RoPE), soft-capped logits, and the layers' output
scalars drawn (HF leaves them at 1, where a missed one would not show). The layouts of the released
models are options: `dense` (the E2B / E4B one) and `moe` (the 26B-A4B one)."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from tests.model.windowed_checkpoints import WINDOW, checkpoint

LAYER_TYPES = ["sliding_attention", "full_attention"] * 3

# KV shared by the last two layers, V = K on the global layers, per-layer inputs, the shared
# layers' MLP twice as wide.
DENSE = dict(
    num_kv_shared_layers=2,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=8,
    use_double_wide_mlp=True,
)
# Routed GELU experts beside every layer's MLP, own V projections, no per-layer inputs.
MOE = dict(
    hidden_size_per_layer_input=0,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
)


def _draw_layer_scalars(hf: transformers.PreTrainedModel) -> None:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))


def gemma4_checkpoint(path: str, **config) -> transformers.PreTrainedModel:
    """The model saved at path with the tiny tokenizer; returns transformers' model. config: the
    layout (DENSE, MOE) and any override."""
    return checkpoint(
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        path,
        init=_draw_layer_scalars,
        **{
            "num_hidden_layers": 6,
            "layer_types": LAYER_TYPES,
            "head_dim": 16,
            "global_head_dim": 32,
            "num_global_key_value_heads": 1,
            "sliding_window": WINDOW,
            "final_logit_softcapping": 30.0,
            "hidden_activation": "gelu_pytorch_tanh",
            "vocab_size_per_layer_input": 1024,  # (HF's default is the real vocabulary's 262144)
            **config,
        },
    )


def write_gemma4_gguf(
    hf: transformers.PreTrainedModel, tokenizer_dir: str, path: str, qtype: str = "f32"
) -> str:
    """hf as llama.cpp's converter writes it (conversion/gemma.py Gemma4Model, --outtype qtype:
    "f32" or "q8_0", its per-tensor type rules): the
    global layers' head size as key_length, the sliding ones' as key_length_swa, per-layer KV heads
    and MLP widths where they differ, the layer pattern as flags, the proportional RoPE as a
    rope_freqs tensor (1 rotates, 1e30 does not) under a whole-head rope dimension count, HF's
    norms as they are (no 1 + w), the router's scales as ffn_gate_inp.scale and
    ffn_down_exps.scale, the layer scalars as layer_output_scale."""
    import gguf

    from tests.model.hybrid_checkpoints import _add_vocab, _stored

    cfg, arch = hf.config, "gemma4"
    n, shared = cfg.num_hidden_layers, cfg.num_kv_shared_layers
    swa = [t == "sliding_attention" for t in cfg.layer_types]
    global_dim = cfg.per_layer_config["full_attention"].head_dim
    global_kv = cfg.per_layer_config["full_attention"].num_key_value_heads
    head_dim = cfg.per_layer_config["sliding_attention"].head_dim
    kv_heads = cfg.per_layer_config["sliding_attention"].num_key_value_heads
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(n)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    ffn = cfg.intermediate_size
    if cfg.use_double_wide_mlp:
        w.add_feed_forward_length([ffn if i < n - shared else 2 * ffn for i in range(n)])
    else:
        w.add_feed_forward_length(ffn)
    w.add_head_count(cfg.num_attention_heads)
    if global_kv != kv_heads:
        w.add_head_count_kv([kv_heads if s else global_kv for s in swa])
    else:
        w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = cfg.rope_parameters
    w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    w.add_key_length(global_dim)
    w.add_value_length(global_dim)
    w.add_key_length_swa(head_dim)
    w.add_value_length_swa(head_dim)
    w.add_rope_dimension_count(global_dim)
    w.add_rope_dimension_count_swa(head_dim)
    w.add_sliding_window(cfg.sliding_window)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input or 0)
    if cfg.enable_moe_block:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.top_k_experts)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    w.add_file_type(ftype)
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    rotating = int(global_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
    freqs = [1.0] * rotating + [1e30] * (global_dim // 2 - rotating)
    w.add_tensor("rope_freqs.weight", np.array(freqs, dtype=np.float32))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, n)
    for name, t in hf.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("router.scale"):
            gname = f"blk.{layer}.ffn_gate_inp.scale"
        elif name.endswith("router.per_expert_scale"):
            gname = f"blk.{layer}.ffn_down_exps.scale"
        else:
            gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if gname is None and name.endswith("layer_scalar"):
                gname = f"blk.{layer}.layer_output_scale.weight"
            if gname is None:
                raise KeyError(f"no GGUF name for {name}")
            if not gname.endswith((".weight", ".bias")):
                gname += ".weight"  # (the converter's filter_tensors suffixes these)
        data, dtype = _stored(gname, t.float(), ftype, gguf.MODEL_ARCH.GEMMA4)
        w.add_tensor(gname, data, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
