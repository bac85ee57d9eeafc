"""llama.cpp's `hunyuan-moe` GGUF architecture (Hunyuan-A13B): its metadata as a transformers
HunYuanMoEV1Config, and its tensor names.

What the converter (conversion/hunyuan.py, HunYuanMoEModel) writes and how it is read back:
- feed_forward_length is intermediate_size, which transformers uses for the experts and the
  shared MLP alike: expert_feed_forward_length and expert_shared_feed_forward_length must equal
  it, expert_shared_count be 1 (else refused, naming the key);
- expert_count / expert_used_count are num_experts / moe_topk;
- the NTK-alpha RoPE is written as its scaled base (rope.freq_base) with scaling type none: read
  as plain RoPE on that base (the same frequencies);
- the per-head q/k norms (applied after RoPE) as attn_q_norm / attn_k_norm, the router
  ffn_gate_inp, the shared MLP ffn_*_shexp, experts stacked (ffn_*_exps); q/k unpermuted (NEOX).
"""

from __future__ import annotations

from typing import Any

from radixlm.model.gguf.archs.glm4moe import GLM4MOE_TENSOR_NAMES
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel


def hunyuan_moe_config(reader, arch: str, kw: dict) -> dict:
    """HunYuanMoEV1Config kwargs of a hunyuan-moe GGUF; kw holds the keys every one shares."""

    def f(key: str, default: Any = None) -> Any:
        field = reader.fields.get(f"{arch}.{key}")
        return default if field is None else field.contents()

    if kw.get("rope_scaling"):
        raise ValueError(f"hunyuan-moe GGUF: rope scaling {kw['rope_scaling']} is not supported")
    inter = int(kw["intermediate_size"])
    for key, want in (
        ("expert_feed_forward_length", inter),
        ("expert_shared_feed_forward_length", inter),
        ("expert_shared_count", 1),
    ):
        value = f(key, want)
        if value != want:
            raise ValueError(f"hunyuan-moe GGUF: {key} {value} is not supported (only {want})")
    names = {t.name for t in reader.tensors}
    out = {k: v for k, v in kw.items() if k not in ("rope_theta", "rope_scaling")}
    out.update(
        attention_bias="blk.0.attn_q.bias" in names,
        num_experts=int(f("expert_count", 0)),
        moe_topk=int(f("expert_used_count", 0)),
        rope_parameters={"rope_type": "default", "rope_theta": float(kw.get("rope_theta", 1e4))},
    )
    return out


HUNYUAN_MOE = GGUFArchitecture(
    HFModel("HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config"),
    config=hunyuan_moe_config,
    tensor_names=GLM4MOE_TENSOR_NAMES,
)
