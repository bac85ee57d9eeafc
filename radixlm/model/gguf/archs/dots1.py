"""llama.cpp's `dots1` GGUF architecture (dots.llm1): its metadata as a transformers Dots1Config,
and its tensor names (GLM-4.5's: DeepSeek's MoE names with Llama's attention).

What the converter (conversion/dots1.py, Dots1Model on Qwen2MoeModel) writes and how it is read
back: expert_count / _used_count / _feed_forward_length, expert_shared_count,
leading_dense_block_count (first_k_dense_replace), expert_weights_scale / _norm
(routed_scaling_factor / norm_topk_prob), expert_group_count / _used_count (n_group / topk_group)
from the config; sigmoid gating with exp_probs_b is llama.cpp's fixed choice for the arch (no
key). q/k norms per head, q/k unpermuted (NEOX RoPE), full rotary; attention_bias where the file
has q biases.
"""

from __future__ import annotations

from typing import Any

from radixlm.model.gguf.archs.deepseek import deepseek_moe_fields
from radixlm.model.gguf.archs.glm4moe import GLM4MOE_TENSOR_NAMES
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel


def dots1_config(reader, arch: str, kw: dict) -> dict:
    """Dots1Config kwargs of a dots1 GGUF; kw holds the keys every architecture shares."""

    def f(key: str, default: Any = None) -> Any:
        field = reader.fields.get(f"{arch}.{key}")
        return default if field is None else field.contents()

    if kw.get("rope_scaling"):
        raise ValueError(f"dots1 GGUF: rope scaling {kw['rope_scaling']} is not supported")
    names = {t.name for t in reader.tensors}
    out = {k: v for k, v in kw.items() if k not in ("rope_theta", "rope_scaling")}
    out.update(
        attention_bias="blk.0.attn_q.bias" in names,
        **deepseek_moe_fields(f, norm_topk_default=False),
        rope_parameters={"rope_type": "default", "rope_theta": float(kw.get("rope_theta", 1e4))},
    )
    return out


DOTS1 = GGUFArchitecture(
    HFModel("Dots1ForCausalLM", "Dots1Config"),
    config=dots1_config,
    tensor_names=GLM4MOE_TENSOR_NAMES,
)
