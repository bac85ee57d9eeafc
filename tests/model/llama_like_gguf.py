"""A tiny HF model of a Llama-like dense family (one attention + one MLP per layer) written the way
llama.cpp's converter writes it (conversion/base.py TextModel, llama.py LlamaModel, and the
family's class), float32 or quantized: --outtype q8_0 (every matrix in Q8_0, F16 where a row is
no multiple of 32), or a Q4_K_M-like mix (Q4_K matrices; where llama-quantize gives Q6_K, to
attn_v / ffn_down / output, Q8_0, as gguf's Python has no Q6_K quantizer; Q8_0 too where a row
does not fill 256-value blocks)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from tests.model.hybrid_checkpoints import _add_vocab

# LlamaModel subclasses (vocab_size and rope.dimension_count in the header); `permute`: the
# ones whose q / k rows LlamaModel.permute reorders for GGML's RoPE.
LLAMA_MODEL = {"arcee": True, "mistral3": True, "apertus": False}
Q4_K_M_HIGHER = ("attn_v.weight", "ffn_down.weight", "output.weight")  # Q6_K in a Q4_K_M


def write_llama_like_gguf(
    hf,
    tokenizer_dir: str,
    path: str,
    arch: str,
    qtype: str = "f32",
    header: Callable | None = None,
    hparams: Callable[[dict], dict] | None = None,
) -> str:
    """hf as the converter writes `arch` (qtype: "f32", "q8_0" or "q4_k_m"); header(writer, hf):
    the family's own set_gguf_parameters keys; hparams(config dict): the values the family's
    class writes instead of TextModel's (HunYuan's stretched RoPE base)."""
    import gguf

    hp = hf.config.to_dict()
    if hparams is not None:
        hp = hparams(hp)
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    _text_model_header(w, hp, qtype)
    if arch in LLAMA_MODEL:  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(hp["vocab_size"])
        w.add_rope_dimension_count(_head_dim(hp))
    if header is not None:
        header(w, hf)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, tokenizer_dir, hp["vocab_size"], "qwen2")
    names = gguf.get_tensor_name_map(
        getattr(gguf.MODEL_ARCH, arch.upper().replace("-", "_")), hp["num_hidden_layers"]
    )
    rope = hp["rope_parameters"]
    if rope.get("rope_type") == "llama3":  # LlamaModel / Exaone4Model.generate_extra_tensors
        w.add_tensor("rope_freqs.weight", _llama3_rope_factors(rope, _head_dim(hp)))
    for name, t in hf.state_dict().items():
        if (hp["tie_word_embeddings"] and name == "lm_head.weight") or ".act_fn." in name:
            continue  # (Apertus' xIELU parameters go to the header)
        a = t.detach().float().numpy().copy()
        if LLAMA_MODEL.get(arch) and name.endswith("q_proj.weight"):
            a = _permute(a, hp["num_attention_heads"])
        elif LLAMA_MODEL.get(arch) and name.endswith("k_proj.weight"):
            a = _permute(a, hp["num_key_value_heads"])
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, f"{arch}: no llama.cpp name for {name}"
        raw, kind = _stored(gname, a, qtype)
        w.add_tensor(gname, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _head_dim(hp: dict) -> int:
    return hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]


def _text_model_header(w, hp: dict, qtype: str) -> None:
    """TextModel.set_gguf_parameters."""
    import gguf

    w.add_block_count(hp["num_hidden_layers"])
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    rope = hp["rope_parameters"]
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key in ("beta_fast", "beta_slow"):
            if rope.get(key) is not None:
                getattr(w, f"add_rope_scaling_yarn_{key}")(rope[key])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    ftype = {"f32": "ALL_F32", "q8_0": "MOSTLY_Q8_0", "q4_k_m": "MOSTLY_Q4_K_M"}[qtype]
    w.add_file_type(getattr(gguf.LlamaFileType, ftype))


def _stored(gname: str, a: np.ndarray, qtype: str) -> tuple[np.ndarray, object]:
    """The type each tensor is written in (vectors and norms float32), and its bytes."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    from radixlm.kernels.formats import quantize as quantize_k

    if a.ndim <= 1 or gname.endswith("_norm.weight") or qtype == "f32":
        return a.astype(np.float32), Q.F32
    if qtype == "q4_k_m" and a.shape[1] % 256 == 0 and not gname.endswith(Q4_K_M_HIGHER):
        return quantize_k(torch.from_numpy(a), "q4_k").numpy(), Q.Q4_K
    if a.shape[1] % 32:
        return a.astype(np.float16), Q.F16
    return quantize(a, Q.Q8_0), Q.Q8_0


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # LlamaModel.permute: each head's rotary halves interleaved
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _llama3_rope_factors(rope: dict, dim: int) -> np.ndarray:
    # LlamaModel.generate_extra_tensors
    base = rope["rope_theta"]
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)
