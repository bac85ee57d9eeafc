"""llama.cpp's Mamba-2 hybrids with muP multipliers: `granitehybrid` (Granite-4.0-H,
GraniteMoeHybridForCausalLM) and `falcon-h1` (FalconH1ForCausalLM): the HF config from their
metadata, their tensors back under the names granite_hybrid.py / falcon_h1.py load, in HF's layout.

Both store the Mamba-2 tensors as nemotron_h's (archs/hybrid_ssm.py; read by tensors.ssm_tensor):
ssm_a = -exp(A_log) [H, 1], ssm_d [H, 1], conv [C, K], the grouped norm [groups, inner / groups],
dt_bias as ssm_dt.bias.

granitehybrid: what the converter (conversion/granite.py GraniteHybridModel over Mamba2Model and
GraniteMoeModel) changes, undone here:
- the layer types are not written: attention where attention.head_count_kv's entry is > 0, else
  Mamba-2 (as llama.cpp reads them);
- the muP multipliers are attention.scale, embedding_scale, residual_scale and logit_scale;
- Bamba (BambaForCausalLM) is written as granitehybrid too: RoPE on (over rope.dimension_count
  of each head: Bamba's first half), no experts, no multipliers (no attention.scale: llama.cpp's
  1 / sqrt(head_dim)), its feed_forward as the dense ffn_gate / ffn_up / ffn_down;
- RoPE is written as rope.scaling.finetuned (false for the hybrid models: no RoPE; the context
  length is then 2**20);
- the attention's q / k rows permuted as for llama's RoPE (undo_permute), RoPE or not;
- the experts' input_linear split into ffn_gate_exps / ffn_up_exps, output_linear ffn_down_exps,
  the router ffn_gate_inp; the shared expert's [gate; up] split into ffn_gate_shexp /
  ffn_up_shexp (ffn_gate / ffn_up / ffn_down when num_local_experts is 0).

falcon-h1 (conversion/falcon_h1.py FalconH1Model over Mamba2Model): every muP multiplier is folded
into the weights (embeddings, lm_head, in_proj's rows per part, q / k / v / o, gate / down,
out_proj), so the config keeps HF's defaults (1); the gated norm's switches are not written:
mamba_rms_norm where ssm_norm tensors exist, normed after the gate (llama.cpp's graph). No q / k
permutation (llama.cpp runs Falcon-H1's RoPE as NeoX).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from radixlm.model.gguf.fields import field, has_tensor, per_layer, required
from radixlm.model.gguf.shard import cut
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel
from radixlm.model.gguf.tensors import SSM_TENSOR_RE, ssm_tensor, unpermute
from radixlm.model.tp_shard import Slicer, TensorSlice

GRANITE = "granitehybrid"

_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ssm_in": "mamba.in_proj",
    "ssm_conv1d": "mamba.conv1d",
    "ssm_dt": "mamba.dt_bias",  # only its bias
    "ssm_a": "mamba.A_log",
    "ssm_d": "mamba.D",
    "ssm_norm": "mamba.norm",
    "ssm_out": "mamba.out_proj",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_shexp": "shared_mlp.gate_proj",
    "ffn_up_shexp": "shared_mlp.up_proj",
    "ffn_down_shexp": "shared_mlp.down_proj",
    "ffn_gate": "shared_mlp.gate_proj",  # dense (no experts): the shared MLP alone
    "ffn_up": "shared_mlp.up_proj",
    "ffn_down": "shared_mlp.down_proj",
}
_FALCON_H1_LAYER = {
    **{k: v for k, v in _LAYER.items() if k.startswith(("ssm_", "attn_"))},
    "ffn_norm": "pre_ff_layernorm",
    "ffn_pre_norm": "pre_ff_layernorm",
    "ffn_gate": "feed_forward.gate_proj",
    "ffn_up": "feed_forward.up_proj",
    "ffn_down": "feed_forward.down_proj",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_FALCON_H1_TOP = {**_TOP, "output_norm": "model.final_layernorm"}


def _mamba2_sizes(reader, a: str) -> dict:
    heads = int(required(reader, a, "ssm.time_step_rank"))
    inner = int(required(reader, a, "ssm.inner_size"))
    if inner % heads:
        raise ValueError(f"{a} GGUF: ssm.inner_size {inner} is not a multiple of {heads} heads")
    return dict(
        mamba_n_heads=heads,
        mamba_d_head=inner // heads,
        mamba_n_groups=int(required(reader, a, "ssm.group_count")),
        mamba_d_state=int(required(reader, a, "ssm.state_size")),
        mamba_d_conv=int(required(reader, a, "ssm.conv_kernel")),
        mamba_conv_bias=has_tensor(reader, ".ssm_conv1d.bias"),
        mamba_proj_bias=has_tensor(reader, ".ssm_in.bias"),
        attention_bias=has_tensor(reader, ".attn_q.bias"),
    )


def falcon_h1_config(reader, arch: str, kw: dict) -> dict:
    """The HF config kwargs of a falcon-h1 GGUF (multipliers folded: HF's defaults of 1)."""
    out = {k: v for k, v in kw.items() if k not in ("rope_theta", "rope_scaling", "rms_norm_eps")}
    eps = field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    sizes = _mamba2_sizes(reader, arch)
    out.update(
        sizes,
        rms_norm_eps=float(eps),
        mamba_d_ssm=sizes["mamba_n_heads"] * sizes["mamba_d_head"],
        mamba_rms_norm=has_tensor(reader, ".ssm_norm.weight"),
        mamba_norm_before_gate=False,
        projectors_bias=has_tensor(reader, ".ssm_out.bias"),
        mlp_bias=has_tensor(reader, ".ffn_up.bias"),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(kw.get("rope_theta", 10_000.0)),
        },
    )
    return out


def granite_hybrid_config(reader, arch: str, kw: dict) -> dict:
    """The HF config kwargs of a granitehybrid GGUF; kw holds the keys every architecture shares."""
    a = arch
    n = int(kw["num_hidden_layers"])
    kv = per_layer(reader, a, "attention.head_count_kv", n)
    sizes = _mamba2_sizes(reader, a)
    inner, hidden = sizes["mamba_n_heads"] * sizes["mamba_d_head"], int(kw["hidden_size"])
    heads = int(kw["num_attention_heads"])
    if inner % hidden:
        raise ValueError(f"{a} GGUF: ssm.inner_size {inner} is no multiple of {hidden}")
    rope = bool(field(reader, f"{a}.rope.scaling.finetuned", False))
    out = {k: v for k, v in kw.items() if k not in ("head_dim", "rope_theta", "rope_scaling")}
    out.update(
        layer_types=["full_attention" if h else "linear_attention" for h in kv],
        num_local_experts=int(field(reader, f"{a}.expert_count", 0) or 0),
        num_experts_per_tok=int(field(reader, f"{a}.expert_used_count", 0) or 0),
        shared_intermediate_size=int(
            field(reader, f"{a}.expert_shared_feed_forward_length") or kw["intermediate_size"]
        ),
        embedding_multiplier=float(field(reader, f"{a}.embedding_scale", 1.0)),
        # Bamba's file has none: llama.cpp's 1 / sqrt(head_dim) then
        attention_multiplier=float(
            field(reader, f"{a}.attention.scale") or (hidden // heads) ** -0.5
        ),
        residual_multiplier=float(field(reader, f"{a}.residual_scale", 1.0)),
        logits_scaling=float(field(reader, f"{a}.logit_scale", 1.0)),
        position_embedding_type="rope" if rope else None,
        mamba_expand=inner // hidden,
        **sizes,
    )
    if rope:
        theta = float(kw.get("rope_theta", 10_000.0))
        out["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        rope_dim = field(reader, f"{a}.rope.dimension_count")
        if rope_dim and int(rope_dim) != hidden // heads:  # Bamba's: half of each head
            out["rope_parameters"]["partial_rotary_factor"] = int(rope_dim) / (hidden // heads)
    if not out["num_local_experts"]:  # HF's dense layers: the shared MLP's width
        out["shared_intermediate_size"] = int(kw["intermediate_size"])
    return out


def mamba2_hybrid_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every tensor of the file, as loader.gguf_weights yields them."""

    granite = field(reader, "general.architecture") == GRANITE
    layer_names, top = (_LAYER, _TOP) if granite else (_FALCON_H1_LAYER, _FALCON_H1_TOP)
    for t in reader.tensors:
        m = SSM_TENSOR_RE.match(t.name)
        if m is None:
            continue
        layer, base, suffix = m.group(1), m.group(2), m.group(3)
        if layer is None:
            if base not in top or not suffix:
                continue  # rope_freqs and the like
            name = f"{top[base]}.{suffix}"
        else:
            if base not in layer_names or int(layer) >= config.num_hidden_layers:
                continue
            name = f"model.layers.{layer}.{layer_names[base]}"
            if base not in ("ssm_dt", "ssm_a", "ssm_d") and suffix:
                name += f".{suffix}"
            elif base in ("ffn_norm", "ffn_pre_norm"):
                # falcon-h1: the converter maps HF's "pre_ff_layernorm.weight" whole, no suffix
                name += ".weight"
        if keep is not None and not keep(name):
            continue
        s = slicer(name) if slicer is not None else None
        ssm = ssm_tensor(t, base, suffix, name, s)
        if ssm is not None:
            yield name, ssm
        elif granite and base in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if base == "attn_q" else config.num_key_value_heads
            yield name, cut(unpermute(read(t, name, None), heads), s, name)
        else:
            yield name, read(t, name, s)


GRANITEHYBRID = GGUFArchitecture(
    HFModel("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig"),
    config=granite_hybrid_config,
    weights=mamba2_hybrid_weights,
)
FALCON_H1 = GGUFArchitecture(
    HFModel("FalconH1ForCausalLM", "FalconH1Config"),
    config=falcon_h1_config,
    weights=mamba2_hybrid_weights,
)
