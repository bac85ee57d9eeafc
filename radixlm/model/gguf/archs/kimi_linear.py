"""llama.cpp's `kimi-linear` GGUF architecture (Kimi-Linear, KimiLinearForCausalLM): the HF config
from its metadata, its tensors back under the names models/kimi_linear.py loads.

What the converter (conversion/kimi_linear.py KimiLinearModel) writes, read back here:
- the layer types as attention.head_count_kv per layer: 0 for a KDA layer, > 0 (1: MLA made MQA)
  for an MLA layer; KDA's heads are attention.head_count (the released model has as many of
  both), their width kda.head_dim, the conv ssm.conv_kernel;
- MLA's head dims in key_length_mla / value_length_mla, the decoupled key in rope.dimension_count
  (never rotated: llama.cpp runs the arch with no RoPE), kv_b_proj split per head (attn_k_b
  transposed, attn_v_b: DeepseekV2ForCausalLM.load_weights joins them);
- the dense MLPs are the first leading_dense_block_count layers; the routed experts stacked 3-D,
  the router sigmoid (expert_gating_func 2) with exp_probs_b, its weights renormalized (llama.cpp's
  graph always does) times expert_weights_scale; expert groups only where expert_group_count is
  written (Moonshot's configs name theirs num_expert_group, which the converter does not read);
- A_log stored as -exp(A_log) [1, heads, 1, 1], dt_bias as ssm_dt.bias, each conv [1, C, 1, K].
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from radixlm.model.gguf.archs.deepseek import DEEPSEEK2_TENSOR_NAMES, SIGMOID_GATING
from radixlm.model.gguf.fields import field
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel
from radixlm.model.tp_shard import Slicer, TensorSlice

_KDA = "model.layers.{}.self_attn."
KIMI_LINEAR_TENSOR_NAMES = {
    **DEEPSEEK2_TENSOR_NAMES,
    "attn_k": _KDA + "k_proj",
    "attn_v": _KDA + "v_proj",
    "ssm_conv1d_q": _KDA + "q_conv1d",
    "ssm_conv1d_k": _KDA + "k_conv1d",
    "ssm_conv1d_v": _KDA + "v_conv1d",
    "ssm_f_a": _KDA + "f_a_proj",
    "ssm_f_b": _KDA + "f_b_proj",
    "ssm_beta": _KDA + "b_proj",
    "ssm_g_a": _KDA + "g_a_proj",
    "ssm_g_b": _KDA + "g_b_proj",
    "ssm_norm": _KDA + "o_norm",
    "ssm_a": _KDA + "A_log",
    "ssm_dt": _KDA + "dt",  # .bias: dt_bias
}
_TENSOR_RE = re.compile(r"^blk\.(\d+)\.(\w+?)(?:\.(weight|bias))?$|^(\w+)\.(weight)$")


def kimi_linear_config(reader, arch: str, kw: dict) -> dict:
    """KimiLinearConfig kwargs of a kimi-linear GGUF; kw holds the keys every architecture
    shares."""
    f = lambda key, default=None: field(reader, f"{arch}.{key}", default)
    if f("expert_gating_func") != SIGMOID_GATING:
        raise ValueError(
            f"{arch}: expert_gating_func {f('expert_gating_func')}: Kimi-Linear routes by sigmoid"
        )
    kv_heads = f("attention.head_count_kv")
    n = kw["num_hidden_layers"]
    kv_heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * n
    rope = int(f("rope.dimension_count"))
    dense = int(f("leading_dense_block_count", 0))
    groups = f("expert_group_count")
    out = {k: v for k, v in kw.items() if k not in ("head_dim", "rope_theta", "rope_scaling")}
    out.update(
        layer_types=["full_attention" if h else "linear_attention" for h in kv_heads],
        mlp_layer_types=["dense" if i < dense else "sparse" for i in range(n)],
        num_key_value_heads=kw["num_attention_heads"],
        linear_num_heads=kw["num_attention_heads"],
        linear_head_dim=int(f("kda.head_dim")),
        linear_conv_kernel_dim=int(f("ssm.conv_kernel")),
        q_lora_rank=f("attention.q_lora_rank") or None,
        kv_lora_rank=int(f("attention.kv_lora_rank")),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=int(f("attention.key_length_mla")) - rope,
        v_head_dim=int(f("attention.value_length_mla")),
        moe_intermediate_size=int(f("expert_feed_forward_length")),
        num_local_experts=int(f("expert_count")),
        num_experts_per_tok=int(f("expert_used_count")),
        n_shared_experts=int(f("expert_shared_count", 0)),
        routed_scaling_factor=float(f("expert_weights_scale", 1.0)),
        norm_topk_prob=True,
        n_group=int(groups or 1),
        topk_group=int(f("expert_group_used_count") or 1) if groups else 1,
    )
    return out


def kimi_linear_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every tensor of the file, as loader.gguf_weights yields them."""
    for t in reader.tensors:
        m = _TENSOR_RE.match(t.name)
        if m is None:
            continue
        layer, base, suffix = m.group(1), m.group(2) or m.group(4), m.group(3) or m.group(5)
        template = KIMI_LINEAR_TENSOR_NAMES.get(base)
        if template is None or (layer is not None and int(layer) >= config.num_hidden_layers):
            continue  # rope_freqs and the like
        name = template.format(layer)
        if base == "ssm_dt":
            name += "_bias"
        elif suffix:
            name += f".{suffix}"
        if keep is not None and not keep(name):
            continue
        s = slicer(name) if slicer is not None else None
        if base == "ssm_a":  # -exp(A_log) -> A_log
            yield name, torch.log(-_dense(read(t, name, None)).reshape(-1))
        elif base.startswith("ssm_conv1d_"):  # [1, C, 1, K] (or [C, 1, K]) -> [C, 1, K]
            w = _dense(read(t, name, None))
            yield name, w.reshape(-1, 1, w.shape[-1])
        else:
            yield name, read(t, name, s)


def _dense(w) -> torch.Tensor:
    """A small tensor as float32 (a 3-D one comes back as experts' blocks; a float tensor's
    dequantize() is itself)."""
    return w.dequantize().float()


KIMI_LINEAR = GGUFArchitecture(
    HFModel("KimiLinearForCausalLM", "KimiLinearConfig"),
    config=kimi_linear_config,
    weights=kimi_linear_weights,
)
