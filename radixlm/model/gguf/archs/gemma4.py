"""llama.cpp's Gemma 4 GGUF (arch gemma4: its converter's Gemma4Model) read back as HF
Gemma4ForCausalLM.

The converter writes the global layers' head size as attention.key_length and the sliding ones' as
key_length_swa, KV heads and feed-forward widths as per-layer arrays where they differ (the global
layers' KV heads; the shared-KV layers' double-wide MLP), the layer pattern as a flag per layer,
attention.shared_kv_layers, and the proportional RoPE of the global layers as a `rope_freqs`
tensor (1 for the rotating frequencies, 1e30 for the others) under rope.dimension_count = the
whole head. Norms are stored as HF's (Gemma 4's are x * w: no 1 + w offset), the layer scalars as
`layer_output_scale`, the router's input scale as `ffn_gate_inp.scale` and its per-expert scale as
`ffn_down_exps.scale`; experts keep HF's [E, 2I, H] / [E, H, I] layouts (yielded as ExpertWeights:
block-quantized ones stay in their blocks, models/gemma4_moe.py). A layer whose V is K's
projection (attention_k_eq_v) has no attn_v.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from radixlm.model.gguf.fields import field, layer_types
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel
from radixlm.model.tp_shard import Slicer, TensorSlice

_TOP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "per_layer_token_embd": "model.embed_tokens_per_layer",
    "per_layer_model_proj": "model.per_layer_model_projection",
    "per_layer_proj_norm": "model.per_layer_projection_norm",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
    "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
    "post_ffw_norm_1": "post_feedforward_layernorm_1",
    "post_ffw_norm_2": "post_feedforward_layernorm_2",
    "ffn_gate_inp.weight": "router.proj.weight",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
    "layer_output_scale.weight": "layer_scalar",
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
}
_TENSOR_RE = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias|scale)$")


def _per_layer(value: Any, n: int) -> list:
    return list(value) if isinstance(value, list) else [value] * n


def gemma4_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) completed for Gemma4TextConfig."""
    kw = dict(kw)
    n = int(kw["num_hidden_layers"])
    tensors = {t.name: t for t in reader.tensors}
    types = layer_types(reader, arch, n)
    full = [i for i in range(n) if types[i] == "full_attention"]
    shared = int(field(reader, f"{arch}.attention.shared_kv_layers", 0) or 0)
    window = field(reader, f"{arch}.attention.sliding_window")
    if window is None:
        raise ValueError(f"a {arch} GGUF without {arch}.attention.sliding_window")
    head_dim = field(reader, f"{arch}.attention.key_length_swa")
    global_dim = field(reader, f"{arch}.attention.key_length")
    if head_dim is None or global_dim is None:
        raise ValueError(f"a {arch} GGUF without attention.key_length and key_length_swa")
    kv = _per_layer(field(reader, f"{arch}.attention.head_count_kv"), n)
    ffn = _per_layer(field(reader, f"{arch}.feed_forward_length"), n)
    sliding_kv = [kv[i] for i in range(n) if i not in full] or kv
    own = [i for i in full if i < n - shared]
    kw.update(
        layer_types=types,
        sliding_window=int(window),
        head_dim=int(head_dim),
        num_key_value_heads=int(sliding_kv[0]),
        intermediate_size=int(min(ffn)),
        use_double_wide_mlp=max(ffn) != min(ffn),
        num_kv_shared_layers=shared,
        attention_k_eq_v=bool(own) and all(f"blk.{i}.attn_v.weight" not in tensors for i in own),
        hidden_activation="gelu_pytorch_tanh",
        hidden_size_per_layer_input=int(
            field(reader, f"{arch}.embedding_length_per_layer_input", 0) or 0
        ),
        final_logit_softcapping=field(reader, f"{arch}.final_logit_softcapping"),
        # Each full layer's shape (HF derives it from global_head_dim and, for V = K models only,
        # num_global_key_value_heads: the file's per-layer heads say it for every model).
        per_layer_config={
            str(i): {"head_dim": int(global_dim), "num_key_value_heads": int(kv[i])} for i in full
        },
    )
    ple = tensors.get("per_layer_token_embd.weight")
    if ple is not None:  # (the converter trims token_embd to the tokenizer, not this one)
        kw["vocab_size_per_layer_input"] = int(ple.data.shape[0])
    experts = field(reader, f"{arch}.expert_count")
    if experts:
        kw.update(
            enable_moe_block=True,
            num_experts=int(experts),
            top_k_experts=int(field(reader, f"{arch}.expert_used_count")),
            moe_intermediate_size=int(field(reader, f"{arch}.expert_feed_forward_length")),
        )
    kw.pop("rope_scaling", None)
    kw["rope_parameters"] = {
        "full_attention": {
            "rope_type": "proportional",
            "rope_theta": float(kw.pop("rope_theta", 1_000_000.0)),
            "partial_rotary_factor": _rotating_share(tensors, int(global_dim)),
        },
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": float(field(reader, f"{arch}.rope.freq_base_swa", 10_000.0)),
        },
    }
    return kw


def _rotating_share(tensors: dict, global_dim: int) -> float:
    """The global layers' partial_rotary_factor: the share of rope_freqs' frequencies that rotate
    (factor 1; the converter writes 1e30 for the others), 1 without the tensor."""
    t = tensors.get("rope_freqs.weight")
    if t is None:
        return 1.0
    factors = np.asarray(t.data, dtype=np.float32).reshape(-1)
    if factors.size != global_dim // 2:
        raise ValueError(
            f"gemma4 GGUF: rope_freqs has {factors.size} entries, the global head {global_dim} dims"
        )
    return float((factors < 1e10).sum()) * 2 / global_dim


def gemma4_weights(
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
        layer, base, suffix = m.groups()
        if layer is None:
            if base not in _TOP or suffix == "scale":
                continue  # rope_freqs: read into the config
            name = f"{_TOP[base]}.{suffix}"
        else:
            hf = LAYER_NAMES.get(f"{base}.{suffix}") or (
                f"{LAYER_NAMES[base]}.{suffix}" if base in LAYER_NAMES else None
            )
            if hf is None:
                continue
            name = f"model.layers.{layer}.{hf}"
        if keep is not None and not keep(name):
            continue
        w = read(t, name, slicer(name) if slicer is not None else None)
        if name.endswith("layer_scalar"):
            w = w.reshape(1)
        yield name, w


GEMMA4 = GGUFArchitecture(
    HFModel("Gemma4ForCausalLM", "Gemma4TextConfig"),
    config=gemma4_config,
    weights=gemma4_weights,
    llama3_rope_freqs=False,  # its rope_freqs are the global layers' proportional RoPE
)
