"""llama.cpp's `phi3` GGUF (its converter's Phi3MiniModel) read back as HF Phi3ForCausalLM.

What the converter writes differently: rope.dimension_count is the rotary width
(partial_rotary_factor), head_dim is embedding / heads, longrope's factors are tensors beside the
original context length, and sliding_window 0 means none. It keeps Phi-3's fused projections: its
attn_qkv is HF's qkv_proj, its ffn_up HF's gate_up_proj (gate rows, then up rows).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from radixlm.model.gguf.fields import field
from radixlm.model.gguf.spec import TENSOR_NAMES, GGUFArchitecture, HFModel

PHI3_TENSOR_NAMES = dict(
    TENSOR_NAMES,
    attn_qkv="model.layers.{}.self_attn.qkv_proj",
    ffn_up="model.layers.{}.mlp.gate_up_proj",
)


def phi3_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) completed for Phi3Config."""
    head_dim = kw["hidden_size"] // kw["num_attention_heads"]
    window = field(reader, f"{arch}.attention.sliding_window")
    out: dict[str, Any] = {"head_dim": head_dim, "sliding_window": window or None}
    n_rot = field(reader, f"{arch}.rope.dimension_count") or head_dim
    if n_rot != head_dim:
        out["partial_rotary_factor"] = n_rot / head_dim
    orig = field(reader, f"{arch}.rope.scaling.original_context_length")
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
        attn = field(reader, f"{arch}.rope.scaling.attn_factor")
        if attn is not None and not math.isclose(attn, default, rel_tol=1e-6):
            rs["attention_factor"] = float(attn)
        out["rope_scaling"] = rs
    return {**kw, **out}


PHI3 = GGUFArchitecture(
    HFModel("Phi3ForCausalLM", "Phi3Config"), config=phi3_config, tensor_names=PHI3_TENSOR_NAMES
)
