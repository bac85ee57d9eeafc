"""llama.cpp's `cohere2` GGUF (Command R7B / A) read back as HF Cohere2ForCausalLM.

The converter's Cohere2Model writes the window, logit_scale and the LayerNorm's epsilon
(attention.layer_norm_epsilon) but no layer pattern: llama.cpp fixes it (every 4th layer global,
as HF's default sliding_window_pattern 4), unless a newer file writes sliding_window_pattern. q / k
stay in HF's interleaved order (llama.cpp's NORM RoPE), turned into rotate_half at load as a
checkpoint's are; its all-zero biases are dropped, so none is read (attention_bias False); the LM
head is the embedding (no output tensor).
"""

from __future__ import annotations

from radixlm.model.gguf.fields import field, layer_types, required
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel

SWA_PERIOD = 4  # llama.cpp's pattern where the file has none


def cohere2_config(reader, arch: str, kw: dict) -> dict:
    kw = dict(kw)
    rope = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
    rope["rope_theta"] = float(kw.pop("rope_theta", 10_000.0))
    head_dim = kw["hidden_size"] // kw["num_attention_heads"]
    rot = field(reader, f"{arch}.rope.dimension_count", head_dim)
    if int(rot) != head_dim:
        raise ValueError(f"{arch} GGUF: rope.dimension_count {rot} (partial RoPE) is not supported")
    kw.pop("head_dim", None)  # Cohere2Config derives it
    kw.pop("rms_norm_eps", None)
    return dict(
        kw,
        rope_parameters=rope,
        sliding_window=int(required(reader, arch, "attention.sliding_window")),
        layer_types=layer_types(reader, arch, kw["num_hidden_layers"], SWA_PERIOD),
        logit_scale=float(required(reader, arch, "logit_scale")),
        layer_norm_eps=float(field(reader, f"{arch}.attention.layer_norm_epsilon", 1e-5)),
    )


COHERE2 = GGUFArchitecture(HFModel("Cohere2ForCausalLM", "Cohere2Config"), config=cohere2_config)
