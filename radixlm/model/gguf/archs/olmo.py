"""llama.cpp's `olmo2` GGUF read back as HF Olmo3ForCausalLM, or Olmo2ForCausalLM: the converter
writes OLMo 2 and OLMo 3 as olmo2, and OLMo 3 is the one with a sliding window.

The converter writes the window and, newer ones, the per-layer pattern (else llama.cpp's default: 3
local layers, then a global one); as llama.cpp's olmo2 graph, the local layers rotate unscaled at
rope.freq_base_swa (else the global base), the global ones with the file's scaling. The norms come
after attention and after the MLP (post_attention_norm, post_ffw_norm).
"""

from __future__ import annotations

from radixlm.model.gguf.fields import field, layer_types
from radixlm.model.gguf.spec import TENSOR_NAMES, GGUFArchitecture, HFModel, Variant

OLMO2_TENSOR_NAMES = dict(
    TENSOR_NAMES,
    post_attention_norm="model.layers.{}.post_attention_layernorm",
    post_ffw_norm="model.layers.{}.post_feedforward_layernorm",
)
SWA_PERIOD = 4  # llama.cpp's pattern where the file has none: every 4th layer global


def _is_olmo2(reader, arch: str) -> bool:
    return not field(reader, f"{arch}.attention.sliding_window")


def olmo_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) completed for Olmo3Config, or for Olmo2Config
    (no window: every layer global, one RoPE)."""
    window = field(reader, f"{arch}.attention.sliding_window")
    if not window:
        rope = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
        rope["rope_theta"] = float(kw.pop("rope_theta", 10_000.0))
        return dict(kw, rope_parameters=rope)
    kw = dict(kw, sliding_window=int(window))
    kw["layer_types"] = layer_types(reader, arch, kw["num_hidden_layers"], SWA_PERIOD)
    full = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
    full["rope_theta"] = float(kw.pop("rope_theta", 10_000.0))
    local_base = field(reader, f"{arch}.rope.freq_base_swa", full["rope_theta"])
    kw["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": float(local_base)},
    }
    return kw


OLMO2 = GGUFArchitecture(
    HFModel("Olmo3ForCausalLM", "Olmo3Config"),
    config=olmo_config,
    variants=(Variant(HFModel("Olmo2ForCausalLM", "Olmo2Config"), _is_olmo2),),
    tensor_names=OLMO2_TENSOR_NAMES,
)
