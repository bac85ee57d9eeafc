"""llama.cpp's `minimax-m2` GGUF architecture (MiniMax-M2): its metadata as a transformers
MiniMaxM2Config, and its tensor names.

What the converter (conversion/minimax.py, MiniMaxM2Model) writes and how it is read back:
- TextModel's header (feed_forward_length is intermediate_size, which is also each expert's width,
  written again as expert_feed_forward_length), attention.key_length the head_dim;
- rope.dimension_count is rotary_dim: partial_rotary_factor = rotary_dim / head_dim;
- the experts stacked per projection (ffn_{gate,up,down}_exps), the router ffn_gate_inp, the
  correction bias exp_probs_b.bias; sigmoid gating is llama.cpp's fixed choice for the arch (no
  key), as is the renormalized top-k;
- q/k norms over the whole projections (attn_q_norm [heads * head_dim]); q/k unpermuted (NEOX).
"""

from __future__ import annotations

from typing import Any

from radixlm.model.gguf.archs.glm4moe import GLM4MOE_TENSOR_NAMES
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel


def minimax_m2_config(reader, arch: str, kw: dict) -> dict:
    """MiniMaxM2Config kwargs of a minimax-m2 GGUF; kw holds the keys every architecture shares."""

    def f(key: str, default: Any = None) -> Any:
        field = reader.fields.get(f"{arch}.{key}")
        return default if field is None else field.contents()

    if kw.get("rope_scaling"):
        raise ValueError(f"minimax-m2 GGUF: rope scaling {kw['rope_scaling']} is not supported")
    gating = f("expert_gating_func", 2)
    if gating != 2:  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
        raise ValueError(f"minimax-m2 GGUF: expert_gating_func {gating} is not supported (sigmoid)")
    out = {k: v for k, v in kw.items() if k not in ("rope_theta", "rope_scaling")}
    head_dim = int(kw["head_dim"])
    out.update(
        intermediate_size=int(f("expert_feed_forward_length", kw.get("intermediate_size"))),
        num_local_experts=int(f("expert_count", 0)),
        num_experts_per_tok=int(f("expert_used_count", 0)),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(kw.get("rope_theta", 10000.0)),
            "partial_rotary_factor": int(f("rope.dimension_count", head_dim)) / head_dim,
        },
    )
    return out


MINIMAX_M2 = GGUFArchitecture(
    HFModel("MiniMaxM2ForCausalLM", "MiniMaxM2Config"),
    config=minimax_m2_config,
    tensor_names=GLM4MOE_TENSOR_NAMES,
)
