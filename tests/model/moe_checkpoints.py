"""Tiny random-weight MoE checkpoints of each family for the tests (hidden 64, 2 layers, 8 experts,
top-2, float32): the HF model, and its weights as safetensors (per expert, as save_pretrained
writes them, or stacked 3-D as transformers 5.x holds them) or as a GGUF written with gguf's
GGUFWriter the way llama.cpp's converter names and lays out MoE tensors."""

from __future__ import annotations

import os

import numpy as np
import torch
import transformers

from tests.checkpoints import add_llama_header
from tests.model.helpers import randomize
from tests.model.test_gguf_archs import _llama_cpp_permute, write_and_close

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
FAMILIES = {
    # name: (config class, config, GGUF architecture)
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(
            BASE,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            shared_expert_intermediate_size=48,
            norm_topk_prob=False,
        ),
        "qwen2moe",
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(
            BASE,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            head_dim=16,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
        "qwen3moe",
    ),
    "mixtral": (
        "MixtralConfig",
        dict(BASE, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
        "llama",
    ),
    "olmoe": (
        "OlmoeConfig",
        dict(
            BASE, intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False
        ),
        "olmoe",
    ),
}
ARCHITECTURES = {
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "olmoe": "OlmoeForCausalLM",
}


def hf_model(family: str, **changes):
    cfg_cls, kw, _ = FAMILIES[family]
    config = getattr(transformers, cfg_cls)(**{**kw, **changes})
    config.architectures = [ARCHITECTURES[family]]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    randomize(hf)
    return hf.eval()


def save_stacked(hf, path: str) -> str:
    """The weights under transformers 5.x's in-memory names (mlp.experts.gate_up_proj [E, 2I, H],
    mlp.experts.down_proj [E, H, I]) in one safetensors file, beside the config."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    hf.config.save_pretrained(path)
    save_file(
        {k: v.contiguous() for k, v in hf.state_dict().items()},
        os.path.join(path, "model.safetensors"),
    )
    return path


_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}


def _expert_blocks(a: np.ndarray, qtype: str) -> tuple[np.ndarray, object]:
    """[E, rows, cols] float32 -> (the GGUF bytes [E, rows, row bytes], its type) for q8_0 /
    q4_k."""
    import gguf

    from radixlm.model.layers.quantized import QuantizedTensor

    kind = getattr(gguf.GGMLQuantizationType, qtype.upper())
    if qtype == "q8_0":
        return gguf.quants.quantize(a, kind), kind
    return (
        np.stack([QuantizedTensor.quantize(torch.from_numpy(e), qtype).data.numpy() for e in a]),
        kind,
    )


def write_gguf(hf, path: str, experts_type: str = "f32") -> str:
    """hf as llama.cpp's converter writes it: per layer ffn_gate_inp, the experts stacked in
    ffn_{gate,up,down}_exps (experts_type: f32, q8_0 or q4_k), the shared expert's *_shexp tensors.
    """
    import gguf

    cfg = hf.config
    arch = FAMILIES[next(f for f, a in ARCHITECTURES.items() if a == cfg.architectures[0])][2]
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(path, arch)
    add_llama_header(w, cfg)
    w.add_key_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_expert_count(getattr(cfg, "num_experts", None) or cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if getattr(cfg, "moe_intermediate_size", None):
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    if getattr(cfg, "shared_expert_intermediate_size", None):
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    for name, t in hf.state_dict().items():
        a = t.float().numpy().copy()
        if not name.startswith("model.layers."):
            gname = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
            w.add_tensor(gname, a)
            continue
        layer, rest = name[len("model.layers.") :].split(".", 1)
        if rest == "mlp.experts.gate_up_proj":  # [E, 2I, H]: llama.cpp stores gate and up apart
            inter = a.shape[1] // 2
            for part, rows in (("gate", a[:, :inter]), ("up", a[:, inter:])):
                _add_experts(
                    w,
                    f"blk.{layer}.ffn_{part}_exps.weight",
                    np.ascontiguousarray(rows),
                    experts_type,
                )
            continue
        if rest == "mlp.experts.down_proj":
            _add_experts(w, f"blk.{layer}.ffn_down_exps.weight", a, experts_type)
            continue
        module, kind = rest.rsplit(".", 1)
        if arch == "llama" and module == "self_attn.q_proj":
            a = _llama_cpp_permute(a, cfg.num_attention_heads)
        elif arch == "llama" and module == "self_attn.k_proj":
            a = _llama_cpp_permute(a, cfg.num_key_value_heads)
        w.add_tensor(f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}", a)
    write_and_close(w)
    return path


def _add_experts(w, name: str, a: np.ndarray, experts_type: str) -> None:
    if experts_type == "f32":
        w.add_tensor(name, a)
    else:
        raw, kind = _expert_blocks(a, experts_type)
        w.add_tensor(name, raw, raw_dtype=kind)
