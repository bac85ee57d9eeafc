"""The HF config of a Gemma 2 / Gemma 3 GGUF: what llama.cpp's converter writes (sliding window,
logit soft-caps, the global layers' RoPE) and what llama.cpp fixes by architecture instead
(src/llama-model.cpp): the local/global layer pattern (Gemma 2: every 2nd layer global, Gemma 3:
every 6th), the local layers' RoPE base (10000), and the attention scale (head_dim ** -0.5, but
hidden / heads for the 27B models, known by their layer count). Its tensors: the sandwich norms
(ffn_norm is the norm before the MLP, the post norms have their own names), and every norm weight
stored as 1 + w, which OffsetRMSNorm adds back (the loader takes the 1 off)."""

from __future__ import annotations

from radixlm.model.gguf.fields import field, layer_types
from radixlm.model.gguf.spec import TENSOR_NAMES, GGUFArchitecture, HFModel

_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
_LAYERS_27B = {"gemma2": 46, "gemma3": 62}
_DEFAULT_WINDOW = {"gemma2": 4096}  # llama.cpp's default where a Gemma 2 file has none


def gemma_config_kwargs(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) completed for a Gemma config class."""
    kw = dict(kw)
    n_layers, head_dim = kw["num_hidden_layers"], kw.get("head_dim")
    window = field(reader, f"{arch}.attention.sliding_window", _DEFAULT_WINDOW.get(arch))
    if window is None:
        raise ValueError(f"{arch} GGUF without {arch}.attention.sliding_window")
    kw["sliding_window"] = int(window)
    kw["layer_types"] = layer_types(reader, arch, n_layers, _SWA_PATTERN[arch])
    kw["hidden_activation"] = "gelu_pytorch_tanh"
    if n_layers == _LAYERS_27B[arch]:
        kw["query_pre_attn_scalar"] = kw["hidden_size"] // kw["num_attention_heads"]
    else:
        kw["query_pre_attn_scalar"] = head_dim or kw["hidden_size"] // kw["num_attention_heads"]
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = field(reader, f"{arch}.{key}")
        if value is not None:
            kw[key] = float(value)
        elif arch == "gemma3":
            kw[key] = (
                None  # Gemma 3 has none unless written (Gemma 2's HF defaults are llama.cpp's)
            )
    if arch == "gemma3":
        # Global layers: the file's base (rope_theta) and scaling; local ones: 10000 unless written.
        full = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
        full["rope_theta"] = float(kw.pop("rope_theta", 1_000_000.0))
        local_base = field(reader, f"{arch}.rope.freq_base_swa", 10_000.0)
        kw["rope_parameters"] = {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": float(local_base)},
        }
    return kw


GEMMA_TENSOR_NAMES = dict(
    TENSOR_NAMES,
    ffn_norm="model.layers.{}.pre_feedforward_layernorm",
    post_attention_norm="model.layers.{}.post_attention_layernorm",
    post_ffw_norm="model.layers.{}.post_feedforward_layernorm",
)
GEMMA2 = GGUFArchitecture(
    HFModel("Gemma2ForCausalLM", "Gemma2Config"),
    config=gemma_config_kwargs,
    tensor_names=GEMMA_TENSOR_NAMES,
    norm_offset=True,
)
GEMMA3 = GGUFArchitecture(
    HFModel("Gemma3ForCausalLM", "Gemma3TextConfig"),
    config=gemma_config_kwargs,
    tensor_names=GEMMA_TENSOR_NAMES,
    norm_offset=True,
)
