"""llama.cpp's hybrid architectures with Mamba-2 or short-conv layers: `nemotron_h` and
`nemotron_h_moe` (NemotronHForCausalLM), `lfm2` (Lfm2ForCausalLM) and `lfm2moe`
(Lfm2MoeForCausalLM): the HF config from their metadata, and their tensors back under HF's names in
HF's layout.

nemotron_h: what the converter (conversion/nemotron.py NemotronHModel, over conversion/granite.py
GraniteHybridModel, conversion/mamba.py Mamba2Model, conversion/llama.py LlamaModel) changes:
- the layer pattern is not written: llama.cpp reads a layer as attention where its
  attention.head_count_kv entry is > 0, an MLP where its feed_forward_length entry is > 0, Mamba-2
  where both are 0; so is it read back (HF's layers_block_type);
- `A_log` [H] is stored as ssm_a = -exp(A_log) reshaped [H, 1]: read back as log(-ssm_a) in
  float64 (the float32 nearest: -exp is not injective in float32, -exp of it gives the file's
  value back); `D` [H] as ssm_d [H, 1];
- `dt_bias` is renamed dt_proj.bias (ssm_dt.bias); `conv1d.weight` [C, 1, K] is squeezed to [C, K];
- the grouped gated norm's weight [intermediate] is reshaped [n_groups, intermediate / n_groups];
- the attention layers' q_proj / k_proj rows are permuted as for llama's RoPE (GraniteHybridModel
  keeps LlamaModel's undo_permute; k over its KV heads), though Nemotron-H's attention has no RoPE
  (the permutation leaves q.k unchanged, so llama.cpp never undoes it): undone here;
- head_dim is written as attention.key_length (rope.dimension_count is hidden / heads), the
  context length as 2**20 (GraniteHybridModel: no RoPE), and the norms' epsilon as
  attention.layer_norm_epsilon unless the config names it rms_norm_eps (then the RMS key);
nemotron_h_moe: what the converter writes for a config with num_experts_per_tok (MoE blocks, E):
- the E layers are its "MLP" layers: feed_forward_length is moe_intermediate_size there, so a
  layer with feed_forward_length > 0 is read as a MoE block (a dense '-' layer has no place in it);
- expert_count, expert_used_count, expert_feed_forward_length, expert_shared_feed_forward_length,
  expert_shared_count, expert_weights_norm, expert_weights_scale and expert_group_count are
  n_routed_experts, num_experts_per_tok, moe_intermediate_size,
  moe_shared_expert_intermediate_size, n_shared_experts, norm_topk_prob, routed_scaling_factor,
  n_group; topk_group is not written (llama.cpp routes with sigmoid + exp_probs_b over all experts,
  no groups), so every group is eligible (topk_group = n_group), as llama.cpp runs it;
  moe_latent_size (Nemotron 3 Super) when present, its projections ffn_latent_down / ffn_latent_up;
- the per-expert tensors are stacked: ffn_up_exps / ffn_down_exps [experts, rows, cols] (up and
  down only: the experts have no gate), the router ffn_gate_inp (kept F32), its
  e_score_correction_bias exp_probs_b.bias, the shared expert ffn_up_shexp / ffn_down_shexp;
- the multi-token-prediction block (Nemotron-3's `mtp.layers.0` attention + `mtp.layers.1` MoE,
  num_nextn_predict_layers 1) is folded into one block appended after the pattern's (block_count
  counts it, `nextn_predict_layers` says so, its head_count_kv and feed_forward_length entries
  both set): mtp.layers.0's enorm / hnorm / eh_proj as nextn.*, its norm attn_norm, its attention
  attn_q / k / v / output (q / k permuted as the other attention layers'); mtp.layers.1's norm as
  post_attention_norm, its MoE as the MoE blocks', its final_layernorm as
  nextn.shared_head_norm. Read back under those `mtp.layers.*` names (_MTP_BLOCK), which the
  target skips and speculative/mtp_checkpoint.py loads as the head; the config gets
  num_nextn_predict_layers and mtp_layers_block_type [full_attention, moe].
lfm2 (conversion/lfm2.py LFM2Model): `conv.conv.weight` [C, 1, L] squeezed to [C, L]; the layer
types from attention.head_count_kv (0: a conv layer, as llama.cpp reads them); the MLP width
written already adjusted (HF's block_auto_adjust_ff_dim), so it is read with the adjustment off;
HF's final `embedding_norm` is token_embd_norm.
lfm2moe (conversion/lfm2.py LFM2MoeModel): LFM2's layers and keys (feed_forward_length is
intermediate_size as it is: LFM2-MoE's dense MLPs have no adjustment), leading_dense_block_count
(num_dense_layers), expert_count / expert_used_count / expert_feed_forward_length, the experts
stacked per layer into ffn_{gate,up,down}_exps, the router ffn_gate_inp (F32), expert_bias as
exp_probs_b.bias. The converter writes neither norm_topk_prob nor routed_scaling_factor, and
llama.cpp's graph always renormalizes and scales by expert_weights_scale only where written: read
as norm_topk_prob true and that scale (else 1.0), as llama.cpp runs the file (LiquidAI's released
configs have exactly these); its expert_gating_func must be sigmoid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from radixlm.model.gguf.fields import field, has_tensor, per_layer, required
from radixlm.model.gguf.shard import cut
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel
from radixlm.model.gguf.tensors import SSM_TENSOR_RE, ssm_tensor, unpermute
from radixlm.model.tp_shard import Slicer, TensorSlice

# llama.cpp name in a layer -> HF name in model.layers.{}; None: by the layer's type (below)
_NEMOTRON_H_LAYER = {
    "attn_norm": "norm",
    "ssm_in": "mixer.in_proj",
    "ssm_conv1d": "mixer.conv1d",
    "ssm_dt": "mixer.dt",  # only its bias: mixer.dt_bias
    "ssm_a": "mixer.A_log",
    "ssm_d": "mixer.D",
    "ssm_norm": "mixer.norm",
    "ssm_out": "mixer.out_proj",
    "attn_q": "mixer.q_proj",
    "attn_k": "mixer.k_proj",
    "attn_v": "mixer.v_proj",
    "attn_output": "mixer.o_proj",
    "ffn_up": "mixer.up_proj",
    "ffn_down": "mixer.down_proj",
}
_NEMOTRON_H_MOE_LAYER = {
    **_NEMOTRON_H_LAYER,
    "ffn_gate_inp": "mixer.gate",
    "exp_probs_b": "mixer.gate",  # only its bias: mixer.gate.e_score_correction_bias
    "ffn_up_exps": "mixer.experts.up_proj",
    "ffn_down_exps": "mixer.experts.down_proj",
    "ffn_up_shexp": "mixer.shared_experts.up_proj",
    "ffn_down_shexp": "mixer.shared_experts.down_proj",
    "ffn_latent_down": "mixer.fc1_latent_proj",  # Nemotron 3 Super (moe_latent_size)
    "ffn_latent_up": "mixer.fc2_latent_proj",
}
# nemotron_h_moe's folded MTP block: llama.cpp name -> (HF `mtp.layers.{i}`, its tensor there)
_MTP_BLOCK = {
    "nextn.enorm": (0, "enorm"),
    "nextn.hnorm": (0, "hnorm"),
    "nextn.eh_proj": (0, "eh_proj"),
    "attn_norm": (0, "norm"),
    **{
        k: (0, v)
        for k, v in _NEMOTRON_H_LAYER.items()
        if k.startswith("attn_") and k != "attn_norm"
    },
    "post_attention_norm": (1, "norm"),
    **{k: (1, v) for k, v in _NEMOTRON_H_MOE_LAYER.items() if k.startswith(("ffn_", "exp_"))},
    "nextn.shared_head_norm": (1, "final_layernorm"),
}
_LFM2_LAYER = {
    "attn_norm": "operator_norm",
    "ffn_norm": "ffn_norm",
    "shortconv.conv": "conv.conv",
    "shortconv.in_proj": "conv.in_proj",
    "shortconv.out_proj": "conv.out_proj",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.out_proj",
    "attn_q_norm": "self_attn.q_layernorm",
    "attn_k_norm": "self_attn.k_layernorm",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2",
}
_LFM2MOE_LAYER = {
    **_LFM2_LAYER,
    "ffn_gate_inp": "feed_forward.gate",
    "ffn_gate_exps": "feed_forward.experts.gate_proj",  # stacked: MoeForCausalLM takes them
    "ffn_up_exps": "feed_forward.experts.up_proj",
    "ffn_down_exps": "feed_forward.experts.down_proj",
    "exp_probs_b": "feed_forward.expert_bias",  # only its bias (below)
}
# The HF name of a layer's exp_probs_b.bias (the choice's per-expert bias).
_EXP_PROBS_B = {
    "nemotron_h_moe": "mixer.gate.e_score_correction_bias",
    "lfm2moe": "feed_forward.expert_bias",
}
_TOP = {
    "nemotron_h": {"token_embd": "model.embeddings", "output_norm": "model.norm_f"},
    # HF's final norm is embedding_norm; older llama.cpp files may call it output_norm
    "lfm2": {
        "token_embd": "model.embed_tokens",
        "token_embd_norm": "model.embedding_norm",
        "output_norm": "model.embedding_norm",
    },
}
_TOP["nemotron_h_moe"] = _TOP["nemotron_h"]
_TOP["lfm2moe"] = _TOP["lfm2"]
_LAYER = {
    "nemotron_h": _NEMOTRON_H_LAYER,
    "nemotron_h_moe": _NEMOTRON_H_MOE_LAYER,
    "lfm2": _LFM2_LAYER,
    "lfm2moe": _LFM2MOE_LAYER,
}
# The tensors of a layer type (the others in that layer are a ValueError naming them).
_STATE_TENSORS = {
    "nemotron_h": {k for k in _NEMOTRON_H_LAYER if k.startswith("ssm_")},
    "nemotron_h_moe": {k for k in _NEMOTRON_H_LAYER if k.startswith("ssm_")},
    "lfm2": {k for k in _LFM2_LAYER if k.startswith("shortconv.")},
}
_STATE_TENSORS["lfm2moe"] = _STATE_TENSORS["lfm2"]
# Where the metadata gives a state tensor's sizes (named when a tensor's shape disagrees).
_SIZES_FROM = {
    "nemotron_h": "embedding_length and the ssm.* sizes",
    "nemotron_h_moe": "embedding_length and the ssm.* sizes",
    "lfm2": "embedding_length and shortconv.l_cache",
}
_SIZES_FROM["lfm2moe"] = _SIZES_FROM["lfm2"]


def ssm_config(reader, arch: str, kw: dict) -> dict:
    """The HF config kwargs of a nemotron_h / lfm2 GGUF; kw holds the keys every architecture
    shares (loader.gguf_config read them already; per-layer lists became their max)."""
    n_all = int(kw["num_hidden_layers"])  # block_count: the MTP block too (nemotron_h_moe)
    nextn = int(field(reader, f"{arch}.nextn_predict_layers", 0) or 0)
    n = n_all - nextn
    kv = per_layer(reader, arch, "attention.head_count_kv", n_all)[:n]
    eps = field(reader, f"{arch}.attention.layer_norm_rms_epsilon")
    if eps is None:
        eps = field(reader, f"{arch}.attention.layer_norm_epsilon", 1e-5)
    out = {
        k: v
        for k, v in kw.items()
        if k not in ("rms_norm_eps", "rope_theta", "rope_scaling", "num_hidden_layers", "head_dim")
    }
    if arch in ("lfm2", "lfm2moe"):
        head_dim = kw.get("head_dim")
        if head_dim and head_dim != kw["hidden_size"] // kw["num_attention_heads"]:
            out["head_dim"] = head_dim  # HF's Lfm2Attention takes a config's head_dim too
        out.update(
            num_hidden_layers=n,
            layer_types=["full_attention" if h else "conv" for h in kv],
            conv_L_cache=int(required(reader, arch, "shortconv.l_cache")),
            conv_bias=has_tensor(reader, ".shortconv.in_proj.bias"),
            norm_eps=float(eps),
            rope_parameters={
                "rope_type": "default",
                "rope_theta": float(kw.get("rope_theta", 1_000_000.0)),
            },
        )
        if arch == "lfm2":
            out["block_auto_adjust_ff_dim"] = False  # feed_forward_length is the MLP's width
        else:
            out.update(_lfm2moe_config(reader, arch))
        return out
    ff = per_layer(reader, arch, "feed_forward_length", n_all)[:n]
    ff_type = "moe" if arch == "nemotron_h_moe" else "mlp"  # what a layer with n_ff > 0 is
    heads = int(required(reader, arch, "ssm.time_step_rank"))
    inner = int(required(reader, arch, "ssm.inner_size"))
    if inner % heads:
        raise ValueError(f"{arch} GGUF: ssm.inner_size {inner} is not a multiple of {heads} heads")
    out.update(
        # llama.cpp: attention where n_head_kv > 0, an MLP where n_ff > 0, else recurrent
        layers_block_type=[
            "full_attention" if h else ff_type if f else "linear_attention" for h, f in zip(kv, ff)
        ],
        head_dim=int(field(reader, f"{arch}.attention.key_length") or kw.get("head_dim")),
        layer_norm_epsilon=float(eps),
        mamba_num_heads=heads,
        mamba_head_dim=inner // heads,
        n_groups=int(required(reader, arch, "ssm.group_count")),
        ssm_state_size=int(required(reader, arch, "ssm.state_size")),
        conv_kernel=int(required(reader, arch, "ssm.conv_kernel")),
        use_conv_bias=has_tensor(reader, ".ssm_conv1d.bias"),
        use_bias=has_tensor(reader, ".ssm_in.bias"),
        mlp_bias=has_tensor(reader, ".ffn_up.bias"),
    )
    if arch == "nemotron_h_moe":
        out.update(_moe_config(reader, arch))
    if nextn:  # the converter folds Nemotron-3's attention + MoE MTP block into one
        out.update(num_nextn_predict_layers=nextn, mtp_layers_block_type=["full_attention", "moe"])
    return out


def _moe_config(reader, arch: str) -> dict:
    """The MoE blocks' HF keys (the module docstring says which GGUF key each is)."""
    f = lambda key, default=None: field(reader, f"{arch}.{key}", default)

    def one(key: str) -> int:
        value = required(reader, arch, key)
        values = {int(v) for v in value if v} if isinstance(value, list) else {int(value)}
        if len(values) != 1:  # NVIDIA's Puzzle models: a size per layer
            raise ValueError(f"{arch} GGUF: {arch}.{key} differs between layers ({value})")
        return values.pop()

    n_group = int(f("expert_group_count") or 1)
    return dict(
        n_routed_experts=one("expert_count"),
        num_experts_per_tok=one("expert_used_count"),
        moe_intermediate_size=one("expert_feed_forward_length"),
        moe_shared_expert_intermediate_size=one("expert_shared_feed_forward_length"),
        n_shared_experts=int(f("expert_shared_count", 1)),
        norm_topk_prob=bool(f("expert_weights_norm", False)),
        routed_scaling_factor=float(f("expert_weights_scale", 1.0)),
        n_group=n_group,
        topk_group=int(f("expert_group_used_count") or n_group),
        moe_latent_size=f("moe_latent_size") or None,
    )


def _lfm2moe_config(reader, arch: str) -> dict:
    """LFM2-MoE's expert keys (the module docstring says how llama.cpp runs them)."""
    gating = field(reader, f"{arch}.expert_gating_func")
    if gating != 2:  # LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
        raise ValueError(f"{arch} GGUF: {arch}.expert_gating_func {gating!r}: only sigmoid (2)")
    return dict(
        num_experts=int(required(reader, arch, "expert_count")),
        num_experts_per_tok=int(required(reader, arch, "expert_used_count")),
        moe_intermediate_size=int(required(reader, arch, "expert_feed_forward_length")),
        num_dense_layers=int(field(reader, f"{arch}.leading_dense_block_count", 0)),
        use_expert_bias=True,  # llama.cpp requires exp_probs_b in every MoE layer
        norm_topk_prob=True,
        routed_scaling_factor=float(field(reader, f"{arch}.expert_weights_scale") or 1.0),
    )


def _nemotron_h_shapes(config) -> dict[str, tuple[int, ...]]:
    """The GGUF shape (HF order) of each Mamba-2 tensor the config's sizes give."""
    c = config
    h, inner, g = c.mamba_num_heads, c.mamba_num_heads * c.mamba_head_dim, c.n_groups
    conv = inner + 2 * g * c.ssm_state_size
    return {
        "ssm_in.weight": (inner + conv + h, c.hidden_size),
        "ssm_in.bias": (inner + conv + h,),
        "ssm_conv1d.weight": (conv, c.conv_kernel),
        "ssm_conv1d.bias": (conv,),
        "ssm_dt.bias": (h,),
        "ssm_a": (h, 1),
        "ssm_d": (h, 1),
        "ssm_norm.weight": (g, inner // g),
        "ssm_out.weight": (c.hidden_size, inner),
        "ssm_out.bias": (c.hidden_size,),
    }


def _lfm2_shapes(config) -> dict[str, tuple[int, ...]]:
    hidden = config.hidden_size
    return {
        "shortconv.conv.weight": (hidden, config.conv_L_cache),
        "shortconv.conv.bias": (hidden,),
        "shortconv.in_proj.weight": (3 * hidden, hidden),
        "shortconv.in_proj.bias": (3 * hidden,),
        "shortconv.out_proj.weight": (hidden, hidden),
        "shortconv.out_proj.bias": (hidden,),
    }


def ssm_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every tensor of the file, as loader.gguf_weights yields them.
    read(t, name, slice): the loader's reader of one tensor (quantized or float32 as asked)."""

    arch = field(reader, "general.architecture")
    nemotron = arch.startswith("nemotron_h")
    types = list(config.layer_types)
    state_type = "linear_attention" if nemotron else "conv"
    shapes = _nemotron_h_shapes(config) if nemotron else _lfm2_shapes(config)
    layer_names, top = _LAYER[arch], _TOP[arch]
    for t in reader.tensors:
        m = SSM_TENSOR_RE.match(t.name)
        if m is None:
            continue
        layer, base, suffix = m.group(1), m.group(2), m.group(3)
        if layer is None:
            if t.name == "output.weight":
                name = "lm_head.weight"
            elif base in top and suffix:
                name = f"{top[base]}.{suffix}"
            else:
                continue  # rope_freqs and the like
        else:
            il = int(layer)
            if il >= len(types):
                if keep is None or il > len(types) or base not in _MTP_BLOCK:
                    continue  # the head's loader asks for them by name; only the first block
                i, hf = _MTP_BLOCK[base]
                prefix = f"mtp.layers.{i}."
            elif base not in layer_names:
                continue
            else:
                prefix, hf = f"model.layers.{il}.", layer_names[base]
            name = prefix + hf + (f".{suffix}" if suffix else "")
            if base == "ssm_dt":
                name = prefix + "mixer.dt_bias"
            elif base == "exp_probs_b":
                name = prefix + _EXP_PROBS_B[arch]
            if base in _STATE_TENSORS[arch]:
                if types[il] != state_type:
                    raise ValueError(
                        f"{t.name} ({name}): a {state_type} tensor in {types[il]} layer {il}"
                        f" (layer types from {arch}.attention.head_count_kv)"
                    )
                want = shapes.get(base + (f".{suffix}" if suffix else ""))
                got = tuple(int(n) for n in reversed(t.shape))  # ggml's ne is [cols, rows]
                if want is not None and got != want:
                    raise ValueError(
                        f"{t.name} ({name}): shape {list(got)} does not match {list(want)}, what"
                        f" {_SIZES_FROM[arch]} in the metadata give"
                    )
        if keep is not None and not keep(name):
            continue
        s = slicer(name) if slicer is not None else None
        ssm = ssm_tensor(t, base, suffix, name, s)
        if ssm is not None:
            yield name, ssm
        elif nemotron and base in ("attn_q", "attn_k") and suffix == "weight":
            yield name, cut(_unpermuted(read(t, name, None), config, base, name), s, name)
        else:
            yield name, read(t, name, s)


def _unpermuted(w, config, base: str, name: str):
    """LlamaModel.permute undone: q over the attention heads, k over the KV heads."""
    from radixlm.model.layers.quantized import QuantizedTensor

    heads = config.num_attention_heads if base == "attn_q" else config.num_key_value_heads
    rows = (w.data if isinstance(w, QuantizedTensor) else w).shape[0]
    if rows != heads * config.head_dim:
        raise ValueError(
            f"{name}: {rows} rows for {heads} heads of head_dim {config.head_dim} (key_length)"
        )
    return unpermute(w, heads)


def _entry(architecture: str, config_class: str) -> GGUFArchitecture:
    return GGUFArchitecture(
        HFModel(architecture, config_class), config=ssm_config, weights=ssm_weights
    )


NEMOTRON_H = _entry("NemotronHForCausalLM", "NemotronHConfig")
NEMOTRON_H_MOE = NEMOTRON_H
LFM2 = _entry("Lfm2ForCausalLM", "Lfm2Config")
LFM2MOE = _entry("Lfm2MoeForCausalLM", "Lfm2MoeConfig")
