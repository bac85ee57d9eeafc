"""llama.cpp's converter for BambaForCausalLM, transcribed on its own (without radixlm's loader):
conversion/granite.py GraniteHybridModel writes Bamba as `granitehybrid` over Mamba2Model,
GraniteMoeModel, GraniteModel, LlamaModel and TextModel: RoPE on (rope.scaling.finetuned), the
attention layers from attn_layer_indices, no multipliers or experts (none in Bamba's config), the
feed_forward as ffn_gate / ffn_up / ffn_down, q / k permuted (LlamaModel.permute). The tensors as
tests/hybrid/mamba2_gguf_writer.py converts Granite-4.0-H's."""

from __future__ import annotations

import json
import os

import gguf

from tests.hybrid.mamba2_gguf_writer import _converted
from tests.model.hybrid_checkpoints import _add_vocab, _stored

FTYPES = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}


def write_bamba_gguf(src: str, path: str, qtype: str = "f32") -> str:
    from safetensors.torch import load_file

    with open(os.path.join(src, "config.json")) as f:
        hp = json.load(f)
    n = hp["num_hidden_layers"]
    attn = list(hp["attn_layer_indices"])
    ssm = [i for i in range(n) if i not in attn]
    hidden, heads, kv = hp["hidden_size"], hp["num_attention_heads"], hp["num_key_value_heads"]
    head_dim = hidden // heads
    # Bamba's released config.json names its rotary width (transformers 5 drops the key and fixes
    # partial_rotary_factor 0.5): half of each head
    rope_dim = hp.get("attn_rotary_emb", head_dim // 2)
    vocab = -(hp["vocab_size"] // -8) * 8  # Mamba2Model.set_vocab (pad_vocab_size_multiple 8)
    ftype = FTYPES[qtype]
    w = gguf.GGUFWriter(path, "granitehybrid")
    w.add_type(gguf.GGUFType.MODEL)
    # TextModel.set_gguf_parameters
    w.add_block_count(n)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv([kv if i in attn else 0 for i in range(n)])  # GraniteHybridModel's
    w.add_rope_freq_base(hp["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_file_type(ftype)
    # LlamaModel (head_dim popped by GraniteModel), then GraniteHybridModel
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(rope_dim)  # attn_rotary_emb, written after LlamaModel's
    w.add_ssm_conv_kernel(hp["mamba_d_conv"])
    w.add_ssm_state_size(hp["mamba_d_state"])
    w.add_ssm_group_count(hp["mamba_n_groups"])
    w.add_ssm_inner_size(hp["mamba_expand"] * hidden)
    w.add_ssm_time_step_rank(hp["mamba_n_heads"])
    w.add_rope_scaling_finetuned(True)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, src, vocab, "qwen2")
    arch = gguf.MODEL_ARCH.GRANITE_HYBRID
    tmap = gguf.get_tensor_name_map(arch, n)
    for name, t in load_file(os.path.join(src, "model.safetensors")).items():
        for new_name, data in _converted(name, t.float(), hp, ssm, False, tmap):
            raw, kind = _stored(new_name, data, ftype, arch)
            w.add_tensor(new_name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
