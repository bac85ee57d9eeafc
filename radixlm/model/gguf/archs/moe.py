"""GGUF mixtures of experts (llama.cpp's names): the config keys of the qwen2moe, qwen3moe, olmoe
architectures and of llama files with experts (Mixtral), and the 3-D expert tensors
ffn_{gate,up,down}_exps read as ExpertWeights (quantized blocks kept as stored, expert after
expert).

llama.cpp does not store norm_topk_prob: it renormalizes the top-k weights for qwen3moe and llama
(Mixtral) and not for qwen2moe and olmoe, unless {arch}.expert_weights_norm says otherwise. Layers
without ffn_gate_inp are dense (HF's mlp_only_layers).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from radixlm.model.tp_shard import TensorSlice

# general.architecture -> (HF architectures name, transformers config class name)
MOE_ARCHITECTURES = {
    "qwen2moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig"),
    "qwen3moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig"),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig"),
}
MIXTRAL = ("MixtralForCausalLM", "MixtralConfig")  # a llama file with experts
_RENORMALIZE = {"qwen2moe": False, "qwen3moe": True, "olmoe": False, "llama": True}

MOE_TENSOR_NAMES = {
    "ffn_gate_inp": "model.layers.{}.mlp.gate",
    "ffn_gate_exps": "model.layers.{}.mlp.experts.gate_proj",
    "ffn_up_exps": "model.layers.{}.mlp.experts.up_proj",
    "ffn_down_exps": "model.layers.{}.mlp.experts.down_proj",
    "ffn_gate_shexp": "model.layers.{}.mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "model.layers.{}.mlp.shared_expert.up_proj",
    "ffn_down_shexp": "model.layers.{}.mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "model.layers.{}.mlp.shared_expert_gate",
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


def read_experts(t, keep_quantized: bool, s: TensorSlice | None, name: str) -> Any:
    """A 3-D expert tensor [experts, rows, cols] (only the experts of slice s, dim 0): ExpertWeights
    with the blocks as stored when keep_quantized and the type has a kernel, else float32 [n, rows,
    cols].
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from radixlm.kernels.formats import GGUF_FORMATS, format_of_ggml
    from radixlm.model.layers.moe.experts import ExpertWeights

    if s is not None and s.dim != 0:
        raise ValueError(f"{t.name} ({name}): experts are split by expert, not by {s}")
    data = t.data
    raw = data.view(np.uint8) if data.dtype not in (np.float32, np.uint8) else data
    if s is not None:
        raw = (
            np.concatenate([raw[a : a + n] for a, n in s.ranges])
            if len(s.ranges) > 1
            else raw[s.ranges[0][0] :][: s.size]
        )
    cols = int(t.shape[0])  # ggml's ne[0]: the input size
    fmt = format_of_ggml(t.tensor_type) if keep_quantized else None
    if keep_quantized and fmt is None and t.tensor_type != GGMLQuantizationType.F32:
        raise ValueError(
            f"{t.name} ({name}): GGUF type {t.tensor_type.name} has no native kernel in radixlm "
            f"(supported: {', '.join(f.upper() for f in GGUF_FORMATS)}, F32); "
            "--quantization none loads it dequantized to float32"
        )
    if fmt is not None:
        return ExpertWeights(torch.from_numpy(np.array(raw)), fmt, raw.shape[1], cols)
    out = dequantize(np.ascontiguousarray(raw), t.tensor_type).reshape(
        raw.shape[0], raw.shape[1], cols
    )
    return torch.from_numpy(out if out.flags.writeable else out.copy()).float()
