"""llama.cpp's gpt-oss GGUF (convert_hf_to_gguf.py GptOssModel) read back as HF GptOssForCausalLM.

What the converter changes, undone here: HF's gate_up_proj [E, hidden, 2 * inter] (gate and up
interleaved by column) becomes ffn_gate_exps and ffn_up_exps [E, inter, hidden] (or, from newer
converters, one ffn_gate_up_exps [E, 2 * inter, hidden]: the gate rows, then the up rows) with
their biases split the same way; down_proj [E, inter, hidden] becomes ffn_down_exps [E, hidden,
inter]; the sinks get a `.weight` suffix. q/k are not permuted (gpt-oss rotates halves, as
llama.cpp's NEOX RoPE). Config: what llama.cpp fixes for the arch instead of writing it: sliding
and full layers alternating from layer 0 (its swa pattern 2), YaRN without truncating the
correction range (the released models' `truncate: false`), swiglu alpha 1.702 and limit 7.

Quantized expert weights (MXFP4 in the released files) stay in their blocks, as ExpertWeights with
gate and up rows interleaved (models/gpt_oss_moe.py runs them on the native kernels), unless float
weights were asked (--quantization none: float32, as HF's columns); the other tensors load as
the loader reads any architecture's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from radixlm.model.gguf.fields import field
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.tp_shard import Slicer, TensorSlice

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate_inp": "mlp.router",
}
_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps")
_TENSOR_RE = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)$")


def gpt_oss_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) completed for GptOssConfig."""
    kw = dict(kw)
    kw["num_local_experts"] = int(field(reader, f"{arch}.expert_count"))
    kw["num_experts_per_tok"] = int(field(reader, f"{arch}.expert_used_count"))
    expert_ffn = field(reader, f"{arch}.expert_feed_forward_length")
    if expert_ffn is not None:
        kw["intermediate_size"] = int(expert_ffn)
    window = field(reader, f"{arch}.attention.sliding_window")
    if window is None:
        raise ValueError(f"a {arch} GGUF without {arch}.attention.sliding_window")
    kw["sliding_window"] = int(window)
    pattern = field(reader, f"{arch}.attention.sliding_window_pattern")
    n = int(kw["num_hidden_layers"])
    local = (
        [bool(p) for p in pattern] if isinstance(pattern, list) else [i % 2 == 0 for i in range(n)]
    )
    kw["layer_types"] = ["sliding_attention" if s else "full_attention" for s in local]
    scaling = kw.pop("rope_scaling", None) or {}
    rope = {"rope_type": "default", "rope_theta": float(kw.pop("rope_theta", 150_000.0))}
    if scaling.get("rope_type") == "yarn":
        rope.update(
            rope_type="yarn",
            factor=scaling["factor"],
            original_max_position_embeddings=scaling.get("original_max_position_embeddings", 4096),
            beta_fast=float(field(reader, f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(field(reader, f"{arch}.rope.scaling.yarn_beta_slow", 1.0)),
            truncate=False,
        )
    kw["rope_parameters"] = rope
    return kw


def _float(w: Any) -> torch.Tensor:
    """A quantized read (ExpertWeights, QuantizedTensor) as float32: the experts run in float."""
    return w if isinstance(w, torch.Tensor) and w.is_floating_point() else w.dequantize().float()


def _interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate / up [..., inter] -> [..., 2 * inter] with gate at even and up at odd positions."""
    return torch.stack((gate, up), dim=-1).flatten(-2)


def _interleave_rows(gate: torch.Tensor, up: torch.Tensor, like: ExpertWeights) -> ExpertWeights:
    """Quantized gate / up rows [E, inter, row_bytes] -> one ExpertWeights of 2 * inter rows, gate
    at even and up at odd rows (each row's blocks move whole: exact)."""
    data = torch.stack((gate, up), dim=2).flatten(1, 2).contiguous()
    return ExpertWeights(data, like.fmt, 2 * gate.shape[1], like.cols)


def gpt_oss_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every tensor of the file, as loader.gguf_weights yields them.
    read(t, name, slice): the loader's reader of one tensor (quantized or float32 as asked)."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}  # (layer, weight|bias): gate / up
    for t in reader.tensors:
        m = _TENSOR_RE.match(t.name)
        if m is None:
            continue
        layer, base, suffix = m.group(1), m.group(2), m.group(3)
        if layer is None:
            if base not in _TOP:
                continue
            name = f"{_TOP[base]}.{suffix}"
        elif base == "attn_sinks":
            name = f"model.layers.{layer}.self_attn.sinks"
        elif base in _EXPERTS:
            name = f"model.layers.{layer}.mlp.experts." + (
                "down_proj" if base == "ffn_down_exps" else "gate_up_proj"
            )
            name += "_bias" if suffix == "bias" else ""
        elif base in _LAYER:
            name = f"model.layers.{layer}.{_LAYER[base]}.{suffix}"
        else:
            continue
        if keep is not None and not keep(name):
            continue
        s = slicer(name) if slicer is not None else None
        if base not in _EXPERTS:
            yield name, read(t, name, s)
            continue
        w = read(t, name, s)
        if isinstance(w, ExpertWeights) and w.quantized:
            # Kept in their blocks (MXFP4 in the released GGUFs): gpt_oss_moe's set_quantized,
            # [E, rows, ...] as stored, gate and up rows interleaved as HF's columns are.
            if base == "ffn_down_exps":
                yield name, w
            elif base == "ffn_gate_up_exps":
                yield name, _interleave_rows(*w.data.chunk(2, dim=1), w)
            else:
                pair = halves.setdefault((int(layer), suffix), {})
                pair[base] = w
                if len(pair) == 2:
                    del halves[(int(layer), suffix)]
                    gate, up = pair["ffn_gate_exps"], pair["ffn_up_exps"]
                    yield name, _interleave_rows(gate.data, up.data, gate)
            continue
        w = _float(w)
        if suffix == "weight":  # ggml's [E, rows, cols]: HF multiplies x @ W, so [E, cols, rows]
            w = w.transpose(1, 2)
        if base == "ffn_down_exps":
            yield name, w.contiguous()
        elif base == "ffn_gate_up_exps":
            yield name, _interleave(*w.chunk(2, dim=-1)).contiguous()
        else:
            pair = halves.setdefault((int(layer), suffix), {})
            pair[base] = w
            if len(pair) == 2:
                del halves[(int(layer), suffix)]
                yield name, _interleave(pair["ffn_gate_exps"], pair["ffn_up_exps"]).contiguous()
    if halves:
        raise ValueError(f"gpt-oss GGUF: experts' gate or up missing in layers {sorted(halves)}")


GPT_OSS = GGUFArchitecture(
    HFModel("GptOssForCausalLM", "GptOssConfig"), config=gpt_oss_config, weights=gpt_oss_weights
)
