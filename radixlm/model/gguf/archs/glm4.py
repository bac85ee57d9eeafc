"""llama.cpp's `glm4` GGUF (GLM-4-0414, GLM-Z1) read back as HF Glm4ForCausalLM.

The converter's Glm4Model writes rope.dimension_count as head_dim * partial_rotary_factor and
attention.key_length as the head_dim; q / k stay in HF's interleaved order (llama.cpp's NORM RoPE,
adjacent pairs), which the model turns into rotate_half at load as it does a checkpoint's. The
fused gate_up_proj is ffn_up ([gate; up] rows, split by llama.cpp's SWIGLU); the norm after
attention is post_attention_norm, the MLP's pre-norm ffn_norm, the one after it post_ffw_norm.
"""

from __future__ import annotations

from radixlm.model.gguf.fields import field
from radixlm.model.gguf.spec import TENSOR_NAMES, GGUFArchitecture, HFModel

GLM4_TENSOR_NAMES = dict(
    TENSOR_NAMES,
    post_attention_norm="model.layers.{}.post_self_attn_layernorm",
    ffn_norm="model.layers.{}.post_attention_layernorm",
    post_ffw_norm="model.layers.{}.post_mlp_layernorm",
    ffn_up="model.layers.{}.mlp.gate_up_proj",
)


def glm4_config(reader, arch: str, kw: dict) -> dict:
    """Glm4Config kwargs: the partial rotary factor, the q/k/v biases present or not."""
    if field(reader, f"{arch}.rope.dimension_sections"):
        raise ValueError(f"{arch} GGUF: rope.dimension_sections (M-RoPE, GLM-4V) is not supported")
    head_dim = int(field(reader, f"{arch}.attention.key_length") or kw["head_dim"])
    rope = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
    rope["rope_theta"] = float(kw.pop("rope_theta", 10_000.0))
    rope["partial_rotary_factor"] = int(field(reader, f"{arch}.rope.dimension_count")) / head_dim
    names = {t.name for t in reader.tensors}
    return dict(
        kw, head_dim=head_dim, rope_parameters=rope, attention_bias="blk.0.attn_q.bias" in names
    )


GLM4 = GGUFArchitecture(
    HFModel("Glm4ForCausalLM", "Glm4Config"), config=glm4_config, tensor_names=GLM4_TENSOR_NAMES
)
