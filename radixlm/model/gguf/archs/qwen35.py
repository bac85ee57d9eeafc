"""llama.cpp's hybrid Gated-DeltaNet architectures: `qwen35` (Qwen3_5ForCausalLM), `qwen35moe`
(Qwen3_5MoeForCausalLM) and `qwen3next` (Qwen3NextForCausalLM): the HF config from their metadata,
and their tensors back under HF's names.

What the converter (convert_hf_to_gguf.py, now conversion/qwen.py: Qwen3NextModel,
_LinearAttentionVReorderBase, _Qwen35MRopeMixin, _Qwen35MtpMixin) changes, undone here:
- `A_log` is stored as ssm_a = -exp(A_log) (`data_torch = -torch.exp(data_torch)`): read back as
  log(-ssm_a) in float64 (the float32 nearest; -exp is not injective in float32, so this is the
  best inverse, and -exp of it gives the file's value back);
- `dt_bias` is renamed `dt_proj.bias` (ssm_dt.bias), values unchanged;
- `conv1d.weight` [C, 1, K] is squeezed to [C, K] (`data_torch = data_torch.squeeze()`);
- every `*norm.weight` but `linear_attn.norm.weight` is stored as 1 + w (`data_torch + 1`: the
  zero-centred RMSNorms); ssm_norm is stored as is;
- qwen3next: in_proj_qkvz ([q, k, v, z] per key head) is split into attn_qkv (all q, all k, all v)
  and attn_gate (all z) (`Qwen3NextModel.modify_tensors`, "in_proj_qkvz.weight"); older files keep
  it whole as ssm_in (llama.cpp: "ssm_in is used by legacy GGUF"); in_proj_ba is ssm_ba, as is;
- the gated q_proj of the full-attention layers (q and gate interleaved per head) is kept whole
  (attn_q, n_embd_head_k * n_head * 2 rows in llama.cpp's loader), so nothing to undo;
- `rope.dimension_count` is int(head_dim * partial_rotary_factor); qwen35/qwen35moe also write the
  M-RoPE sections (llama.cpp runs them interleaved, as HF's `mrope_interleaved`);
- the MTP block (_QwenMtpMixin: Qwen3.5, Qwen3.5-MoE, Qwen3-Next) is appended after HF's layers
  (block_count counts its nextn_predict_layers): `mtp.layers.0.*` as a full-attention block
  `blk.N.*` (N = HF's num_hidden_layers), mtp.fc / pre_fc_norm_embedding / pre_fc_norm_hidden /
  norm as `blk.N.nextn.{eh_proj, enorm, hnorm, shared_head_norm}`, its norms stored as 1 + w too;
  no embedding or LM head of its own (the model's are shared). The target skips it (config's
  num_hidden_layers); speculative/mtp_checkpoint.py reads it under the NextN names of
  model.layers.N with a config one layer longer (layers past layer_types are the MTP blocks).

Kept as the file has it, NOT undone: qwen35/qwen35moe where linear_num_key_heads !=
linear_num_value_heads (`_LinearAttentionVReorderBase.modify_tensors`) store the V heads in ggml's
tiled order (value head h uses key head h % Hk) instead of HF's grouped order (h // (Hv // Hk)),
in the V rows of in_proj_qkv, the rows of in_proj_z, in_proj_a, in_proj_b, A_log, dt_bias, the V
channels of conv1d and the columns of out_proj. The loaded tensors are the file's, in that order,
and the config it builds says so: `linear_value_heads_tiled = True` (absent, i.e. False, for
every other file and for HF checkpoints). GatedDeltaNet runs that order as it is (it repeats q and
k to the value heads tiled), so out_proj keeps its quantized blocks, whatever the block size.
qwen3next's split in_proj_qkvz is joined back with its blocks as stored, or requantized to Q8_0
with a warning when its two halves are stored in different types.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from radixlm.model.gguf.fields import field
from radixlm.model.gguf.shard import cut
from radixlm.model.gguf.spec import EXPERT_TENSOR_NAMES, GGUFArchitecture, HFModel
from radixlm.model.tp_shard import Slicer, TensorSlice

logger = logging.getLogger(__name__)

_MROPE = ("qwen35", "qwen35moe")  # llama.cpp: LLAMA_ROPE_TYPE_IMROPE; qwen3next: NEOX, no sections

# llama.cpp name in a layer (with its suffix where HF's differs) -> HF name in model.layers.{}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_in": "linear_attn.in_proj_qkvz",
    "ssm_ba": "linear_attn.in_proj_ba",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "ssm_a": "linear_attn.A_log",  # no suffix in the file (llama.cpp's SSM_A_NOSCAN)
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # the converter's --fuse-gate-up-exps: [E, 2I, H], gate rows then up rows, as HF's gate_up_proj
    "ffn_gate_up_exps": "mlp.experts.gate_up_proj",
    **{k: v.removeprefix("model.layers.{}.") for k, v in EXPERT_TENSOR_NAMES.items()},
    # the MTP block's own (_QwenMtpMixin's renames of mtp.fc, mtp.pre_fc_norm_*, mtp.norm)
    "nextn.eh_proj": "eh_proj",
    "nextn.enorm": "enorm",
    "nextn.hnorm": "hnorm",
    "nextn.shared_head_norm": "shared_head.norm",
    "nextn.embed_tokens": "embed_tokens",
    "nextn.shared_head_head": "shared_head.head",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_TENSOR_RE = re.compile(r"^(?:blk\.(\d+)\.)?((?:nextn\.)?\w+)(?:\.(weight|bias))?$")
_SPARSE_RE = re.compile(r"^blk\.(\d+)\.ffn_gate_inp\.weight$")
_warned: set[str] = set()


def qwen35_config(reader, arch: str, kw: dict) -> dict:
    """The HF config kwargs of a qwen35 / qwen35moe / qwen3next GGUF; kw holds the keys every
    architecture shares (loader.gguf_config read them already)."""

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"{arch} GGUF without {arch}.{key}")
        return value

    f = lambda key, default=None: field(reader, f"{arch}.{key}", default)
    out = {k: v for k, v in kw.items() if k not in ("head_dim", "rope_theta", "rope_scaling")}
    # block_count counts the appended MTP blocks (_Qwen35MtpMixin); HF's layers are the others.
    n_layers = int(kw["num_hidden_layers"]) - int(f("nextn_predict_layers", 0))
    head_dim = int(f("attention.key_length") or kw["hidden_size"] // kw["num_attention_heads"])
    n_k, n_v = int(need("ssm.group_count")), int(need("ssm.time_step_rank"))
    if n_v % n_k:
        raise ValueError(
            f"{arch} GGUF: ssm.time_step_rank {n_v} is not a multiple of ssm.group_count {n_k}"
        )
    interval = int(f("full_attention_interval", 4))  # llama.cpp's default too
    if arch in _MROPE and n_v != n_k:  # _LinearAttentionVReorderBase: V heads tiled, kept so
        out["linear_value_heads_tiled"] = True
    out.update(
        num_hidden_layers=n_layers,
        head_dim=head_dim,
        linear_conv_kernel_dim=int(need("ssm.conv_kernel")),
        linear_key_head_dim=int(need("ssm.state_size")),
        linear_num_key_heads=n_k,
        linear_num_value_heads=n_v,
        linear_value_head_dim=int(need("ssm.inner_size")) // n_v,
        # llama.cpp: recurrent where (il + 1) % interval != 0; HF's layer_types alike
        layer_types=[
            "linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)
        ],
    )
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(kw.get("rope_theta", 10000.0)),
        "partial_rotary_factor": int(f("rope.dimension_count") or head_dim) / head_dim,
    }
    rope.update(kw.get("rope_scaling") or {})
    if arch in _MROPE:
        sections = f("rope.dimension_sections") or [11, 11, 10, 0]  # the converter's default
        rope.update(mrope_section=[int(s) for s in sections[:3]], mrope_interleaved=True)
    out["rope_parameters"] = rope
    if nextn := int(f("nextn_predict_layers", 0)):  # speculative/mtp_checkpoint.py reads it
        out["num_nextn_predict_layers"] = nextn
    if arch != "qwen35":
        out.update(
            num_experts=int(need("expert_count")),
            num_experts_per_tok=int(need("expert_used_count")),
            moe_intermediate_size=int(need("expert_feed_forward_length")),
            shared_expert_intermediate_size=int(f("expert_shared_feed_forward_length", 0)),
        )
    if arch == "qwen3next":  # llama.cpp renormalizes the top-k weights unless told otherwise
        out["norm_topk_prob"] = bool(f("expert_weights_norm", True))
        sparse = {int(m.group(1)) for t in reader.tensors if (m := _SPARSE_RE.match(t.name))}
        out["mlp_only_layers"] = [i for i in range(n_layers) if i not in sparse]
        out["decoder_sparse_step"] = 1
    return out


class _Dims:
    """The linear-attention sizes of a config, and the GGUF shape of each tensor."""

    def __init__(self, config):
        c = config
        self.hidden = c.hidden_size
        self.nk, self.nv = c.linear_num_key_heads, c.linear_num_value_heads
        self.hk, self.hv = c.linear_key_head_dim, c.linear_value_head_dim
        self.r = self.nv // self.nk  # value heads per key head
        self.qk = 2 * self.nk * self.hk  # the q and k rows (and conv channels)
        self.v = self.nv * self.hv
        # the MTP blocks past layer_types (a config one layer longer: mtp_checkpoint.py's) are
        # full-attention layers (the converter's recurrent_layers marks them so)
        self.full = [t == "full_attention" for t in c.layer_types]
        self.full += [True] * (c.num_hidden_layers - len(self.full))
        self.shapes = {
            "attn_qkv": (self.qk + self.v, self.hidden),
            "attn_gate": (self.v, self.hidden),
            "ssm_in": (self.qk + 2 * self.v, self.hidden),
            "ssm_ba": (2 * self.nv, self.hidden),
            "ssm_beta": (self.nv, self.hidden),
            "ssm_alpha": (self.nv, self.hidden),
            "ssm_a": (self.nv,),
            "ssm_dt.bias": (self.nv,),
            "ssm_conv1d": (self.qk + self.v, c.linear_conv_kernel_dim),
            "ssm_norm": (self.hv,),
            "ssm_out": (self.hidden, self.v),
        }

    def qkvz(self) -> torch.Tensor:
        """Index into cat(attn_qkv, attn_gate) of each in_proj_qkvz row ([q, k, v, z] per key
        head), the inverse of Qwen3NextModel's split."""
        hk, rv, qk, v = self.hk, self.r * self.hv, self.qk, self.v
        parts = []
        for g in range(self.nk):
            parts += [
                torch.arange(g * hk, (g + 1) * hk),
                torch.arange(qk // 2 + g * hk, qk // 2 + (g + 1) * hk),
                torch.arange(qk + g * rv, qk + (g + 1) * rv),
                torch.arange(qk + v + g * rv, qk + v + (g + 1) * rv),
            ]
        return torch.cat(parts)


def qwen35_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every tensor of the file's first config.num_hidden_layers blocks, as
    loader.gguf_weights yields them (an MTP block among them under its NextN names). read(t, name,
    slice): the loader's reader of one tensor (quantized or float32 as asked).
    """
    from radixlm.model.gguf.shard import read_tensor

    arch = field(reader, "general.architecture")
    dims = _Dims(config)
    n_layers = config.num_hidden_layers
    pending: dict[str, tuple[str, Any]] = {}  # qwen3next's in_proj_qkvz: the half read first
    for t in reader.tensors:
        m = _TENSOR_RE.match(t.name)
        if m is None:
            continue
        layer, base, suffix = m.group(1), m.group(2), m.group(3)
        key = f"{base}.{suffix}" if f"{base}.{suffix}" in _LAYER_NAMES else base
        if layer is None:
            if base not in _TOP_NAMES or suffix is None:
                continue
            name = f"{_TOP_NAMES[base]}.{suffix}"
        else:
            il = int(layer)
            if il >= n_layers or key not in _LAYER_NAMES:  # the MTP block(s) past the config's
                continue
            tail = _LAYER_NAMES[key]
            if arch == "qwen3next" and base in ("attn_qkv", "attn_gate"):
                tail = "linear_attn.in_proj_qkvz"
            name = f"model.layers.{il}.{tail}" + (f".{suffix}" if key == base and suffix else "")
            if key in dims.shapes or base in ("attn_qkv", "attn_gate"):
                if dims.full[il]:
                    raise ValueError(
                        f"{t.name} ({name}): a linear-attention tensor in full-attention layer"
                        f" {il} (layer_types from {arch}.full_attention_interval)"
                    )
                _check_shape(t, name, dims.shapes[key])
        if keep is not None and not keep(name):
            continue
        s = slicer(name) if slicer is not None else None
        if name.endswith("norm.weight"):
            w = read(t, name, s)
            # zero-centred norms (1 + w): the converter stored w + 1 (exact for w in [-0.5, 1])
            yield name, w if name.endswith("linear_attn.norm.weight") else w - 1
        elif key == "ssm_a":
            a = read(t, name, None).double()
            if not bool((a < 0).all()):
                raise ValueError(f"{t.name} ({name}): ssm_a must be -exp(A_log) < 0")
            yield name, cut(torch.log(-a).float(), s, name)
        elif base == "ssm_conv1d":  # [C, K] as float32 always: HF's is [C, 1, K]
            yield name, cut(read_tensor(t, None, None, name), s, name).unsqueeze(1)
        elif arch == "qwen3next" and base in ("attn_qkv", "attn_gate"):  # split in_proj_qkvz
            other = "attn_gate" if base == "attn_qkv" else "attn_qkv"
            part = read(t, name, None)
            if name not in pending:
                pending[name] = (base, part)
                continue
            parts = {base: part, other: pending.pop(name)[1]}
            w = _cat_rows(parts["attn_qkv"], parts["attn_gate"], name)
            yield name, cut(_permute_rows(w, dims.qkvz()), s, name)
        else:
            yield name, read(t, name, s)
    if pending:
        name, (base, _) = next(iter(pending.items()))
        raise ValueError(f"{name}: the GGUF has its {base} half but not the other")


def _check_shape(t, name: str, want: tuple[int, ...]) -> None:
    got = tuple(int(n) for n in reversed(t.shape))  # ggml's ne is [cols, rows]
    if got != want:
        raise ValueError(
            f"{t.name} ({name}): shape {list(got)} does not match {list(want)}, what the"
            " linear-attention sizes in the metadata (ssm.*) give"
        )


def _permute_rows(w, perm: torch.Tensor):
    """Rows in perm's order; a quantized matrix moves whole rows of blocks (exact)."""
    from radixlm.model.layers.quantized import QuantizedTensor

    if isinstance(w, QuantizedTensor):
        return QuantizedTensor(w.data[perm].contiguous(), w.fmt, w.cols)
    return w[perm].contiguous()


def _cat_rows(a, b, name: str):
    """[a; b]: quantized blocks kept where both halves have one type."""
    from radixlm.model.layers.quantized import QuantizedTensor

    qa, qb = isinstance(a, QuantizedTensor), isinstance(b, QuantizedTensor)
    if qa and qb and a.fmt == b.fmt:
        return QuantizedTensor(torch.cat([a.data, b.data]), a.fmt, a.cols)
    if not qa and not qb:
        return torch.cat([a, b])
    kinds = "/".join(
        x.fmt.name.upper() if isinstance(x, QuantizedTensor) else "F32" for x in (a, b)
    )
    return _requantized(
        torch.cat([_dequantized(a), _dequantized(b)]), name, f"attn_qkv/attn_gate are {kinds}"
    )


def _dequantized(w) -> torch.Tensor:
    from radixlm.kernels.formats import dequantize_reference
    from radixlm.model.layers.quantized import QuantizedTensor

    if not isinstance(w, QuantizedTensor):
        return w
    return dequantize_reference(w.data, w.fmt.name, w.cols).reshape(-1, w.cols).float()


def _requantized(w: torch.Tensor, name: str, why: str):
    """w (float32) as Q8_0 blocks, or float32 where its columns are no multiple of 32."""
    from radixlm.kernels.formats import FORMATS
    from radixlm.model.layers.quantized import QuantizedTensor

    target = "q8_0" if FORMATS["q8_0"].supports(w.shape[1]) else "f32"
    if why not in _warned:
        _warned.add(why)
        logger.warning(
            "%s: %s, so its stored blocks cannot be joined as they are; it is requantized to %s"
            " (so is every such tensor)",
            name,
            why,
            target.upper(),
        )
    return w if target == "f32" else QuantizedTensor.quantize(w, target)


def _entry(architecture: str, config_class: str) -> GGUFArchitecture:
    return GGUFArchitecture(
        HFModel(architecture, config_class), config=qwen35_config, weights=qwen35_weights
    )


QWEN35 = _entry("Qwen3_5ForCausalLM", "Qwen3_5TextConfig")
QWEN35MOE = _entry("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig")
QWEN3NEXT = _entry("Qwen3NextForCausalLM", "Qwen3NextConfig")
