"""llama.cpp's state-space architectures: `mamba2` (Mamba2ForCausalLM), `mamba`
(MambaForCausalLM, and FalconMambaForCausalLM where ssm.dt_b_c_rms is set) and `jamba`
(JambaForCausalLM: Mamba-1, attention and MoE): the HF config from their metadata, their tensors
back under the names models/mamba.py and models/jamba.py load, in HF's layout.

What the converter (conversion/mamba.py MambaModel, Mamba2Model) changes, undone here:
- the sizes are ssm.* keys: conv_kernel, inner_size, state_size, time_step_rank (Mamba-2: its
  heads; Mamba-1: dt_proj's rank) and group_count (Mamba-2); the norms' epsilon is
  attention.layer_norm_rms_epsilon; no attention keys (head_count 0);
- A_log is stored as ssm_a = -exp(A_log) (Mamba-2: reshaped [H, 1]; Mamba-1: [D, N] as it is),
  read back as log(-ssm_a) in float64 (tensors.ssm_tensor); D as ssm_d (Mamba-2: [H, 1]);
- Mamba-2's dt_bias is ssm_dt.bias; Mamba-1's dt_proj is ssm_dt (weight and bias) and x_proj ssm_x;
- conv1d.weight [C, 1, K] is squeezed to [C, K]; Mamba-2's gated norm [groups, inner / groups];
- an lm_head equal to the embedding is dropped (tied: the file has no output tensor);
- jamba: the layer pattern is not written: attention where attention.head_count_kv's entry is
  > 0, a MoE where the layer has a router (ffn_gate_inp), each read back as HF's period and
  offset; the experts stacked (ffn_{gate,up,down}_exps), the dense MLPs ffn_{gate,up,down}; the
  mixer's weighted norms ssm_dt_norm / ssm_b_norm / ssm_c_norm.
FalconMamba's B / C / dt norms have no weights and no epsilon of their own in the file: llama.cpp
norms them with the file's RMS epsilon (HF's layer_norm_epsilon, where HF uses mixer_rms_eps), and
so does radixlm reading the file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from radixlm.model.gguf.fields import field, has_tensor, per_layer, required
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel, Variant
from radixlm.model.gguf.tensors import SSM_TENSOR_RE, ssm_tensor
from radixlm.model.tp_shard import Slicer, TensorSlice

_LAYER = {
    "attn_norm": "norm",
    "ssm_in": "mixer.in_proj",
    "ssm_conv1d": "mixer.conv1d",
    "ssm_x": "mixer.x_proj",
    "ssm_dt": "mixer.dt_proj",  # Mamba-2: only its bias, mixer.dt_bias
    "ssm_a": "mixer.A_log",
    "ssm_d": "mixer.D",
    "ssm_norm": "mixer.norm",
    "ssm_out": "mixer.out_proj",
}
_TOP = {"token_embd": "model.embeddings", "output_norm": "model.norm_f", "output": "lm_head"}


def _common(reader, arch: str, kw: dict) -> dict:
    """The keys both share; the attention keys TextModel writes as 0 dropped."""
    out = {k: v for k, v in kw.items() if k not in ("num_attention_heads", "intermediate_size")}
    out.pop("max_position_embeddings", None)  # 2**20: "arbitrary" (the converter's words)
    eps = float(out.pop("rms_norm_eps", 1e-5))
    return dict(
        out,
        layer_norm_epsilon=eps,
        conv_kernel=int(required(reader, arch, "ssm.conv_kernel")),
        state_size=int(required(reader, arch, "ssm.state_size")),
        use_conv_bias=has_tensor(reader, ".ssm_conv1d.bias"),
        use_bias=has_tensor(reader, ".ssm_in.bias"),
    )


def mamba2_config(reader, arch: str, kw: dict) -> dict:
    out = _common(reader, arch, kw)
    heads = int(required(reader, arch, "ssm.time_step_rank"))
    inner = int(required(reader, arch, "ssm.inner_size"))
    hidden = int(out["hidden_size"])
    if inner % heads or inner % hidden:
        raise ValueError(
            f"{arch} GGUF: ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {heads}"
            f" heads and of embedding_length {hidden}"
        )
    return dict(
        out,
        num_heads=heads,
        head_dim=inner // heads,
        expand=inner // hidden,
        n_groups=int(required(reader, arch, "ssm.group_count")),
    )


def mamba_config(reader, arch: str, kw: dict) -> dict:
    out = _common(reader, arch, kw)
    inner = int(required(reader, arch, "ssm.inner_size"))
    hidden = int(out["hidden_size"])
    if inner % hidden:
        raise ValueError(f"{arch} GGUF: ssm.inner_size {inner} is no multiple of {hidden}")
    out.update(
        expand=inner // hidden,
        time_step_rank=int(required(reader, arch, "ssm.time_step_rank")),
    )
    if _falcon_mamba(reader, arch):
        out["mixer_rms_eps"] = out["layer_norm_epsilon"]  # as llama.cpp norms B / C / dt
    return out


def _period(layers: list[int], n: int, what: str, arch: str) -> tuple[int, int]:
    """(period, offset) with layers == [i for i < n if i % period == offset] (HF Jamba's rule), or a
    ValueError naming what the file's layers are."""
    if not layers:
        return n + 1, n  # none (offset < period, as HF checks)
    offset = layers[0]
    period = layers[1] - layers[0] if len(layers) > 1 else n
    if period <= offset or [i for i in range(n) if i % period == offset] != layers:
        raise ValueError(
            f"{arch} GGUF: {what} layers {layers} are not every k-th from one offset (Jamba's"
            " attn_layer_period / expert_layer_period)"
        )
    return period, offset


def jamba_config(reader, arch: str, kw: dict) -> dict:
    """Jamba's config: the attention layers where attention.head_count_kv's entry is > 0, the MoE
    layers where a router (ffn_gate_inp) is (as llama.cpp reads them)."""
    n = int(kw["num_hidden_layers"])
    kv = per_layer(reader, arch, "attention.head_count_kv", n)
    attn_period, attn_offset = _period([i for i in range(n) if kv[i]], n, "attention", arch)
    names = {t.name for t in reader.tensors}
    routed = [i for i in range(n) if f"blk.{i}.ffn_gate_inp.weight" in names]
    moe_period, moe_offset = _period(routed, n, "MoE", arch)
    inner = int(required(reader, arch, "ssm.inner_size"))
    hidden = int(kw["hidden_size"])
    if inner % hidden:
        raise ValueError(f"{arch} GGUF: ssm.inner_size {inner} is no multiple of {hidden}")
    out = {k: v for k, v in kw.items() if k not in ("head_dim", "rope_theta", "rope_scaling")}
    out.update(
        attn_layer_period=attn_period,
        attn_layer_offset=attn_offset,
        expert_layer_period=moe_period,
        expert_layer_offset=moe_offset,
        num_experts=int(field(reader, f"{arch}.expert_count", 1) or 1),
        num_experts_per_tok=int(field(reader, f"{arch}.expert_used_count", 1) or 1),
        mamba_d_conv=int(required(reader, arch, "ssm.conv_kernel")),
        mamba_d_state=int(required(reader, arch, "ssm.state_size")),
        mamba_dt_rank=int(required(reader, arch, "ssm.time_step_rank")),
        mamba_expand=inner // hidden,
        mamba_conv_bias=has_tensor(reader, ".ssm_conv1d.bias"),
        mamba_proj_bias=has_tensor(reader, ".ssm_in.bias"),
    )
    return out


def _falcon_mamba(reader, arch: str) -> bool:
    return bool(field(reader, f"{arch}.ssm.dt_b_c_rms", False))


_JAMBA_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "pre_ff_layernorm",
    **{k: v.replace("mixer.", "mamba.") for k, v in _LAYER.items() if k.startswith("ssm_")},
    "ssm_dt_norm": "mamba.dt_layernorm",
    "ssm_b_norm": "mamba.b_layernorm",
    "ssm_c_norm": "mamba.c_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
_JAMBA_TOP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.final_layernorm",
    "output": "lm_head",
}
# general.architecture -> (layer names, top-level names, whether ssm_dt is Mamba-1's dt_proj)
_NAMES = {
    "mamba2": (_LAYER, _TOP, False),
    "mamba": (_LAYER, _TOP, True),
    "jamba": (_JAMBA_LAYER, _JAMBA_TOP, True),
}


def mamba_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every tensor of the file, as loader.gguf_weights yields them."""
    layer_names, top, mamba1 = _NAMES[field(reader, "general.architecture")]
    for t in reader.tensors:
        m = SSM_TENSOR_RE.match(t.name)
        if m is None:
            continue
        layer, base, suffix = m.group(1), m.group(2), m.group(3)
        if layer is None:
            if base not in top or not suffix:
                continue
            name = f"{top[base]}.{suffix}"
        else:
            if base not in layer_names or int(layer) >= config.num_hidden_layers:
                continue
            name = f"model.layers.{layer}.{layer_names[base]}"
            if base == "ssm_dt" and not mamba1:
                name = name.replace("dt_proj", "dt_bias")
            elif base not in ("ssm_a", "ssm_d") and suffix:
                name += f".{suffix}"
        if keep is not None and not keep(name):
            continue
        s = slicer(name) if slicer is not None else None
        ssm = ssm_tensor(t, base, suffix, name, s)
        if ssm is not None and base == "ssm_a" and mamba1:  # [D, N], flattened by ssm_tensor
            ssm = ssm.reshape(-1, t.shape[0])
        yield name, ssm if ssm is not None else read(t, name, s)


MAMBA2 = GGUFArchitecture(
    HFModel("Mamba2ForCausalLM", "Mamba2Config"), config=mamba2_config, weights=mamba_weights
)
MAMBA = GGUFArchitecture(
    HFModel("MambaForCausalLM", "MambaConfig"),
    config=mamba_config,
    weights=mamba_weights,
    variants=(Variant(HFModel("FalconMambaForCausalLM", "FalconMambaConfig"), _falcon_mamba),),
)
JAMBA = GGUFArchitecture(
    HFModel("JambaForCausalLM", "JambaConfig"), config=jamba_config, weights=mamba_weights
)
