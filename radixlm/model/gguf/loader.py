"""GGUF files (llama.cpp's format): HF config from metadata, HF-named dequantized weights.

Only the parts radixlm runs: architectures llama (SmolLM2, Llama 2/3, Mistral), smollm3, qwen2,
qwen3, phi3, olmo2 with a sliding window (OLMo 3), gemma2 and gemma3 (gguf_gemma.py: what llama.cpp
fixes by architecture instead of writing it),
the MoE ones (gguf_moe.py, gguf_deepseek.py) and the hybrid qwen35, qwen35moe, qwen3next
(gguf_qwen35.py: the converter's transformations undone, its tiled V-head order kept), nemotron_h
and lfm2 (gguf_hybrid_ssm.py), granitehybrid and falcon-h1 (gguf_mamba2_hybrid.py), gpt-oss
(gguf_gpt_oss.py), gemma4 (gguf_gemma4.py), llama4 (gguf_llama4.py), kimi-linear
(gguf_kimi_linear.py).
With keep_quantized, 2-D weights in a format the native kernels read
(radixlm.kernels.formats.FORMATS: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_XS, F16, BF16) stay as stored, F32 ones are plain float32, and any other type is refused
by name (no silent float32 copy at several times the file's memory); 1-D tensors (norms, biases) are
always float32. Without keep_quantized every tensor is dequantized to float32 at load with gguf's
own (vectorized numpy) kernels, so they equal what transformers' GGUF loader produces.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from radixlm.model.gguf.archs.deepseek import DEEPSEEK2_TENSOR_NAMES, deepseek2_config
from radixlm.model.gguf.archs.gemma import GEMMA_ARCHS, gemma_config_kwargs, layer_types
from radixlm.model.gguf.archs.gemma4 import GEMMA4_ARCHITECTURES, gemma4_config, gemma4_weights
from radixlm.model.gguf.archs.glm4moe import GLM4MOE_TENSOR_NAMES, glm4moe_config
from radixlm.model.gguf.archs.gpt_oss import GPT_OSS_ARCHITECTURES, gpt_oss_config, gpt_oss_weights
from radixlm.model.gguf.archs.hybrid_ssm import SSM_ARCHITECTURES, ssm_config, ssm_weights
from radixlm.model.gguf.archs.kimi_linear import (
    KIMI_LINEAR_ARCHITECTURES,
    kimi_linear_config,
    kimi_linear_weights,
)
from radixlm.model.gguf.archs.llama4 import LLAMA4_ARCHITECTURES, llama4_config
from radixlm.model.gguf.archs.mamba2_hybrid import (
    MAMBA2_HYBRID_ARCHITECTURES,
    falcon_h1_config,
    granite_hybrid_config,
    mamba2_hybrid_weights,
)
from radixlm.model.gguf.archs.moe import (
    MIXTRAL,
    MOE_ARCHITECTURES,
    MOE_TENSOR_NAMES,
    has_experts,
    moe_config_kwargs,
)
from radixlm.model.gguf.archs.qwen35 import QWEN35_ARCHITECTURES, qwen35_config, qwen35_weights
from radixlm.model.gguf.fields import field
from radixlm.model.tp_shard import Slicer, TensorSlice

# general.architecture -> (HF architectures name, transformers config class name)
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "LlamaConfig"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config"),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config"),
    # llama.cpp fixes SmolLM3's NoPE layers (every 4th) as transformers' default interval does.
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config"),
    # The converter writes OLMo 2 and OLMo 3 as olmo2; OLMo 3 is the one with a window (_olmo3).
    "olmo2": ("Olmo3ForCausalLM", "Olmo3Config"),
    "phi3": ("Phi3ForCausalLM", "Phi3Config"),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config"),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig"),
    **MOE_ARCHITECTURES,
    **QWEN35_ARCHITECTURES,
    **SSM_ARCHITECTURES,
    **MAMBA2_HYBRID_ARCHITECTURES,
    **GPT_OSS_ARCHITECTURES,
    **GEMMA4_ARCHITECTURES,
    **LLAMA4_ARCHITECTURES,
    **KIMI_LINEAR_ARCHITECTURES,
    "deepseek2": (
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
    ),  # V3 when its gating is sigmoid (gguf_deepseek.py)
    "glm4moe": ("Glm4MoeForCausalLM", "Glm4MoeConfig"),  # gguf_glm4moe.py
}
# A llama file with a sliding window is a Mistral (llama.cpp writes Mistral as llama).
_MISTRAL = ("MistralForCausalLM", "MistralConfig")

# {arch}.<key> -> HF config attribute
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}

# llama.cpp tensor names -> HF names ({} = layer index)
_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "model.layers.{}.input_layernorm",
    "ffn_norm": "model.layers.{}.post_attention_layernorm",
    "attn_q": "model.layers.{}.self_attn.q_proj",
    "attn_k": "model.layers.{}.self_attn.k_proj",
    "attn_v": "model.layers.{}.self_attn.v_proj",
    "attn_output": "model.layers.{}.self_attn.o_proj",
    "attn_q_norm": "model.layers.{}.self_attn.q_norm",
    "attn_k_norm": "model.layers.{}.self_attn.k_norm",
    "ffn_gate": "model.layers.{}.mlp.gate_proj",
    "ffn_up": "model.layers.{}.mlp.up_proj",
    "ffn_down": "model.layers.{}.mlp.down_proj",
    **MOE_TENSOR_NAMES,
}
# Per architecture, where its tensors differ. Gemma's sandwich norms: ffn_norm is the norm before
# the MLP, the post norms have their own names. llama.cpp keeps Phi-3's fused projections, and its
# ffn_up is HF's gate_up_proj (gate rows, then up rows).
_GEMMA_TENSOR_NAMES = dict(
    _TENSOR_NAMES,
    ffn_norm="model.layers.{}.pre_feedforward_layernorm",
    post_attention_norm="model.layers.{}.post_attention_layernorm",
    post_ffw_norm="model.layers.{}.post_feedforward_layernorm",
)
_ARCH_TENSOR_NAMES = {
    "olmo2": dict(
        _TENSOR_NAMES,
        post_attention_norm="model.layers.{}.post_attention_layernorm",
        post_ffw_norm="model.layers.{}.post_feedforward_layernorm",
    ),
    "gemma2": _GEMMA_TENSOR_NAMES,
    "gemma3": _GEMMA_TENSOR_NAMES,
    "phi3": dict(
        _TENSOR_NAMES,
        attn_qkv="model.layers.{}.self_attn.qkv_proj",
        ffn_up="model.layers.{}.mlp.gate_up_proj",
    ),
    "deepseek2": DEEPSEEK2_TENSOR_NAMES,
    "glm4moe": GLM4MOE_TENSOR_NAMES,
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_TOP_RE = re.compile(r"^(\w+)\.(weight|bias)$")


def gguf_architecture(reader) -> str:
    arch = field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; radixlm reads:"
            f" {', '.join(GGUF_ARCHITECTURES)}"
        )
    return arch


def gguf_config(reader):
    """The transformers config the GGUF metadata describes."""
    import transformers

    arch = gguf_architecture(reader)
    hf_arch, config_cls = GGUF_ARCHITECTURES[arch]
    kw: dict[str, Any] = {}
    for key, attr in _CONFIG_KEYS.items():
        value = field(reader, f"{arch}.{key}")
        if value is not None:
            kw[attr] = max(value) if isinstance(value, list) else value  # per-layer kv heads
    head_dim = field(reader, f"{arch}.attention.key_length") or field(
        reader, f"{arch}.rope.dimension_count"
    )
    if head_dim:
        kw["head_dim"] = head_dim
    tensor_names = {t.name for t in reader.tensors}
    if "vocab_size" not in kw:
        kw["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    kw["tie_word_embeddings"] = "output.weight" not in tensor_names
    for tok_key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = field(reader, f"tokenizer.ggml.{tok_key}")
        if value is not None:
            kw["pad_token_id" if tok_key == "padding_token_id" else tok_key] = value
    rope_scaling = _rope_scaling(reader, arch, kw)
    if rope_scaling:
        kw["rope_scaling"] = rope_scaling
    window = field(reader, f"{arch}.attention.sliding_window")
    if arch == "llama" and window:
        hf_arch, config_cls = _MISTRAL
        kw["sliding_window"] = window
    if has_experts(reader, arch):
        kw = moe_config_kwargs(reader, arch, kw)
        if arch == "llama":
            hf_arch, config_cls = MIXTRAL
    if arch in GEMMA_ARCHS:
        kw = gemma_config_kwargs(reader, arch, kw)
    if arch == "phi3":
        kw.update(_phi3_config(reader, kw))
    if arch == "olmo2":
        kw = _olmo3_config(reader, kw)
    if arch == "deepseek2":
        hf_arch, config_cls, kw = deepseek2_config(reader, kw)
    if arch == "glm4moe":
        kw = glm4moe_config(reader, kw)
    if arch in QWEN35_ARCHITECTURES:
        kw = qwen35_config(reader, arch, kw)
    if arch in SSM_ARCHITECTURES:
        kw = ssm_config(reader, arch, kw)
    if arch == "granitehybrid":
        kw = granite_hybrid_config(reader, kw)
    if arch == "falcon-h1":
        kw = falcon_h1_config(reader, kw)
    if arch in GPT_OSS_ARCHITECTURES:
        kw = gpt_oss_config(reader, kw)
    if arch in GEMMA4_ARCHITECTURES:
        kw = gemma4_config(reader, kw)
    if arch in LLAMA4_ARCHITECTURES:
        kw = llama4_config(reader, kw)
    if arch in KIMI_LINEAR_ARCHITECTURES:
        kw = kimi_linear_config(reader, kw)
    config = getattr(transformers, config_cls)(**kw)
    config.architectures = [hf_arch]
    return config


def _rope_scaling(reader, arch: str, kw: dict) -> dict | None:
    scaling_type = field(reader, f"{arch}.rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        out = {
            "rope_type": scaling_type,
            "factor": float(field(reader, f"{arch}.rope.scaling.factor", 1.0)),
        }
        orig = field(reader, f"{arch}.rope.scaling.original_context_length")
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        return out
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None and arch not in GEMMA4_ARCHITECTURES:  # (gemma4: its proportional RoPE)
        # Llama 3.1+: llama.cpp bakes llama3 scaling into per-frequency factors
        return _llama3_from_rope_freqs(np.asarray(freqs.data, dtype=np.float32), kw)
    return None


def _llama3_from_rope_freqs(factors: np.ndarray, kw: dict) -> dict:
    """Recover HF's llama3 rope_scaling from llama.cpp's rope_freqs; verified, not guessed."""
    from radixlm.model.layers.rotary import compute_inv_freq

    head_dim = kw.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
    base = {"rope_type": "default", "rope_theta": kw.get("rope_theta", 10000.0)}
    params = dict(
        base,
        rope_type="llama3",
        factor=float(factors.max()),
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    default, _ = compute_inv_freq(base, head_dim, 0)
    scaled, _ = compute_inv_freq(params, head_dim, 0)
    if not np.allclose((default / scaled).numpy(), factors, rtol=1e-3):
        raise ValueError(
            "GGUF rope_freqs do not match llama3 rope scaling (low 1, high 4, original 8192)"
        )
    del params["rope_theta"]
    return params


def _phi3_config(reader, kw: dict) -> dict:
    """What llama.cpp's converter (Phi3MiniModel) writes differently: rope.dimension_count is the
    rotary width (partial_rotary_factor), head_dim is embedding / heads, longrope's factors are
    tensors beside the original context length, and sliding_window 0 means none."""
    head_dim = kw["hidden_size"] // kw["num_attention_heads"]
    window = field(reader, "phi3.attention.sliding_window")
    out: dict[str, Any] = {"head_dim": head_dim, "sliding_window": window or None}
    n_rot = field(reader, "phi3.rope.dimension_count") or head_dim
    if n_rot != head_dim:
        out["partial_rotary_factor"] = n_rot / head_dim
    orig = field(reader, "phi3.rope.scaling.original_context_length")
    if orig:
        out["original_max_position_embeddings"] = orig = int(orig)
    factors = {
        t.name: np.asarray(t.data, np.float32)
        for t in reader.tensors
        if t.name.startswith("rope_factors_")
    }
    if factors:
        rs = {
            "rope_type": "longrope",
            "long_factor": factors["rope_factors_long.weight"].tolist(),
            "short_factor": factors["rope_factors_short.weight"].tolist(),
        }
        # The converter writes transformers' default attention factor (from the context ratio);
        # pass one on only where it is another (it is stored in float32).
        scale = kw["max_position_embeddings"] / orig
        default = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        attn = field(reader, "phi3.rope.scaling.attn_factor")
        if attn is not None and not math.isclose(attn, default, rel_tol=1e-6):
            rs["attention_factor"] = float(attn)
        out["rope_scaling"] = rs
    return out


def _olmo3_config(reader, kw: dict) -> dict:
    """The converter's sliding window and per-layer pattern (llama.cpp's default: 3 local layers,
    then a global one); as llama.cpp's olmo2 graph, the local layers rotate unscaled at
    rope.freq_base_swa (else the global base), the global ones with the file's scaling."""
    window = field(reader, "olmo2.attention.sliding_window")
    if not window:
        raise ValueError("an olmo2 GGUF without a sliding window is OLMo 2: radixlm runs OLMo 3")
    kw = dict(kw, sliding_window=int(window))
    kw["layer_types"] = layer_types(reader, "olmo2", kw["num_hidden_layers"])
    full = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
    full["rope_theta"] = float(kw.pop("rope_theta", 10_000.0))
    local_base = field(reader, "olmo2.rope.freq_base_swa", full["rope_theta"])
    kw["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": float(local_base)},
    }
    return kw


def _hf_name(name: str, arch: str = "llama") -> str | None:
    names = _ARCH_TENSOR_NAMES.get(arch, _TENSOR_NAMES)
    m = _BLOCK_RE.match(name)
    if m:
        hf = names.get(m.group(2))
        return None if hf is None else f"{hf.format(m.group(1))}.{m.group(3)}"
    m = _TOP_RE.match(name)
    if m and m.group(1) in names:
        return f"{names[m.group(1)]}.{m.group(2)}"
    return None


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's convert-time permutation of q/k rows (each head's rotary pairs
    interleaved for GGML's RoPE) back to HF's rotate_half layout."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .transpose(1, 2)
        .reshape(w.shape)
    )


def gguf_weights(
    reader,
    config,
    keep_quantized: bool = False,
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every model tensor, one at a time (peak memory stays at the model
    plus one tensor): a QuantizedTensor for 2-D tensors in a kernel format when keep_quantized
    (ValueError for a 2-D type with no kernel other than F32), else float32. Single-threaded on
    purpose: numpy's dequant kernels are memory-bound and threads made them slower here.
    slicer (tensor parallelism): HF name -> the part of the tensor this rank holds; only that part
    is read from the file (gguf_shard.py). keep (a pipeline stage): the HF names read at all."""
    arch = field(reader, "general.architecture")
    read = functools.partial(_read, keep_quantized=keep_quantized)
    if arch in QWEN35_ARCHITECTURES:  # norms, decays and split projections (gguf_qwen35.py)
        yield from qwen35_weights(reader, config, read, slicer, keep)
        return
    if arch in SSM_ARCHITECTURES:  # Mamba-2 / short-conv tensors reshaped (gguf_hybrid_ssm.py)
        yield from ssm_weights(reader, config, read, slicer, keep)
        return
    if arch in MAMBA2_HYBRID_ARCHITECTURES:  # the same Mamba-2 tensors (gguf_mamba2_hybrid.py)
        yield from mamba2_hybrid_weights(reader, config, read, slicer, keep)
        return
    if arch in GPT_OSS_ARCHITECTURES:  # experts re-interleaved, sinks renamed (gguf_gpt_oss.py)
        yield from gpt_oss_weights(reader, config, read, slicer, keep)
        return
    if arch in GEMMA4_ARCHITECTURES:  # per-layer shapes, scales renamed (gguf_gemma4.py)
        yield from gemma4_weights(reader, config, read, slicer, keep)
        return
    if arch in KIMI_LINEAR_ARCHITECTURES:  # KDA's A, convs and dt_bias (gguf_kimi_linear.py)
        yield from kimi_linear_weights(reader, config, read, slicer, keep)
        return
    permute = arch in ("llama", "smollm3")  # the converters that permute q/k (LlamaModel's)
    norm_offset = arch in GEMMA_ARCHS  # llama.cpp stores Gemma's norm weights as 1 + w
    for t in reader.tensors:
        name = _hf_name(t.name, arch)
        if name is None or (
            keep is not None and not keep(name)
        ):  # rope_freqs (read into the config) and the like
            continue
        full_rows = t.data.shape[0]
        w = read(t, name, slicer(name) if slicer is not None else None)
        if permute and ".self_attn.q_proj." in name:
            w = _unpermute_rows(w, config.num_attention_heads, full_rows)
        elif permute and ".self_attn.k_proj." in name:
            w = _unpermute_rows(w, config.num_key_value_heads, full_rows)
        elif norm_offset and name.endswith("norm.weight"):
            w = w - 1  # exact for the stored fl(1 + w): GemmaRMSNorm adds the 1 back
        yield name, w


def _read(t, name: str, s: TensorSlice | None, keep_quantized: bool) -> Any:
    """One tensor (only slice s of it when given) as gguf_weights yields it: ExpertWeights for a
    3-D experts tensor (gguf_moe.py), a QuantizedTensor for a 2-D one in a kernel format when
    keep_quantized (ValueError for a 2-D type with no kernel other than F32), else float32."""
    from gguf import GGMLQuantizationType

    from radixlm.kernels.formats import GGUF_FORMATS, format_of_ggml
    from radixlm.model.gguf.archs.moe import read_experts
    from radixlm.model.gguf.shard import read_tensor

    if t.data.ndim == 3:
        return read_experts(t, keep_quantized, s, name)
    fmt = format_of_ggml(t.tensor_type) if keep_quantized and t.data.ndim == 2 else None
    if (
        keep_quantized
        and t.data.ndim == 2
        and fmt is None
        and t.tensor_type != GGMLQuantizationType.F32
    ):
        raise ValueError(
            f"{t.name} ({name}): GGUF type {t.tensor_type.name} has no native kernel in radixlm"
            f" (supported: {', '.join(f.upper() for f in GGUF_FORMATS)}, F32);"
            " --quantization none loads it dequantized to float32"
        )
    return read_tensor(t, fmt, s, name)


def _unpermute_rows(w, n_head: int, full_rows: int):
    """_unpermute of whole heads (a tensor-parallel rank's slice holds whole heads: the permutation
    acts within each head, so the slice's heads un-permute alone). Quantized blocks move as rows."""
    from radixlm.model.layers.quantized import QuantizedTensor

    heads = (
        n_head
        * (w.shape[0] if not isinstance(w, QuantizedTensor) else w.data.shape[0])
        // full_rows
    )
    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(_unpermute(w.data, heads).contiguous(), w.fmt, w.cols)
    return _unpermute(w, heads)


def gguf_eos_token_ids(reader) -> list[int]:
    ids = [
        field(reader, f"tokenizer.ggml.{k}")
        for k in ("eos_token_id", "eot_token_id", "eom_token_id")
    ]
    return list(dict.fromkeys(i for i in ids if i is not None))


def gguf_chat_template(reader) -> str | None:
    return field(reader, "tokenizer.chat_template")
