"""GGUF mixtures of experts (llama.cpp's names): the config keys of the qwen2moe, qwen3moe, olmoe
architectures and of llama files with experts (Mixtral, archs/llama.py). The 3-D expert tensors
ffn_{gate,up,down}_exps are read as ExpertWeights (tensors.read_experts: quantized blocks kept as
stored, expert after expert), under spec.EXPERT_TENSOR_NAMES.

llama.cpp does not store norm_topk_prob: it renormalizes the top-k weights for qwen3moe and llama
(Mixtral) and not for qwen2moe and olmoe, unless {arch}.expert_weights_norm says otherwise. Layers
without ffn_gate_inp are dense (HF's mlp_only_layers).
"""

from __future__ import annotations

import re
from typing import Any

from radixlm.model.gguf.spec import GGUFArchitecture, HFModel

_RENORMALIZE = {
    "qwen2moe": False,
    "qwen3moe": True,
    "olmoe": False,
    "llama": True,
    "qwen3vlmoe": True,  # Qwen3-VL-MoE's text model (archs/qwen.py)
}
_ROUTER_RE = re.compile(r"^blk\.(\d+)\.ffn_gate_inp\.weight$")


def has_experts(reader, arch: str) -> bool:
    """An arch this module reads (Qwen-MoE, OLMoE, Mixtral as llama) with experts; deepseek2 has its
    own."""
    if arch not in _RENORMALIZE:
        return False
    f = reader.fields.get(f"{arch}.expert_count")
    return f is not None and int(f.contents()) > 0


def moe_config_kwargs(reader, arch: str, kw: dict) -> dict:
    """kw (the dense keys already read) plus the MoE ones, under the HF config's names."""

    def get(key: str, default: Any = None) -> Any:
        f = reader.fields.get(f"{arch}.{key}")
        return default if f is None else f.contents()

    out = dict(kw)
    experts = int(get("expert_count"))
    out["num_local_experts" if arch == "llama" else "num_experts"] = experts
    out["num_experts_per_tok"] = int(get("expert_used_count"))
    if (
        get("expert_feed_forward_length") is not None
    ):  # qwen: experts' size apart from the dense MLP's
        out["moe_intermediate_size"] = int(get("expert_feed_forward_length"))
    if get("expert_shared_feed_forward_length") is not None:
        out["shared_expert_intermediate_size"] = int(get("expert_shared_feed_forward_length"))
    if arch != "llama":
        out["norm_topk_prob"] = bool(get("expert_weights_norm", _RENORMALIZE[arch]))
        sparse = {int(m.group(1)) for t in reader.tensors if (m := _ROUTER_RE.match(t.name))}
        out["mlp_only_layers"] = [i for i in range(int(kw["num_hidden_layers"])) if i not in sparse]
    if arch == "olmoe":
        out.pop("head_dim", None)  # OLMoE's head size is hidden / heads
    return out


def moe_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) with the MoE ones where the file has experts."""
    return moe_config_kwargs(reader, arch, kw) if has_experts(reader, arch) else kw


QWEN2MOE = GGUFArchitecture(HFModel("Qwen2MoeForCausalLM", "Qwen2MoeConfig"), config=moe_config)
QWEN3MOE = GGUFArchitecture(HFModel("Qwen3MoeForCausalLM", "Qwen3MoeConfig"), config=moe_config)
OLMOE = GGUFArchitecture(HFModel("OlmoeForCausalLM", "OlmoeConfig"), config=moe_config)
