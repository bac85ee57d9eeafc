"""llama.cpp's Gemma 3n GGUF (arch gemma3n: its converter's Gemma3NModel) read back as HF
Gemma3nForCausalLM.

The converter writes per-layer feed-forward widths as an array, the layer pattern as a flag per
layer, attention.shared_kv_layers, altup.active_idx / num_inputs, embedding_length_per_layer_input
and, instead of activation_sparsity_pattern, each layer's std multiplier
(`activation_sparsity_scale`: Normal(0, 1).icdf(sparsity) in float32, -inf for a dense layer),
which the model takes as it is (config.activation_sparsity_scale). The AltUp (un)embedding
projections are stacked into one [A - 1, hidden, hidden] tensor each (`altup_proj`,
`altup_unembd_proj`); norms are stored as HF's (x * w). The per-layer embedding table is padded
with zero rows up to the vocabulary, so ids past HF's `vocab_size_per_layer_input` (the image /
audio soft tokens) read zeros here, as in llama.cpp, where HF reads its row 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from radixlm.model.gguf.archs.gemma4 import LAYER_NAMES as GEMMA4_LAYER_NAMES
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
_STACKED = {
    "altup_proj": "model.altup_projections",
    "altup_unembd_proj": "model.altup_unembed_projections",
}
_LAYER = {
    **GEMMA4_LAYER_NAMES,
    "altup_correct_coef": "altup.correction_coefs",
    "altup_correct_scale.weight": "altup.correct_output_scale",  # (a vector: no .weight in HF)
    "altup_predict_coef": "altup.prediction_coefs",
    "altup_router": "altup.modality_router",
    "altup_router_norm": "altup.router_norm",
    "laurel_l": "laurel.linear_left",
    "laurel_r": "laurel.linear_right",
    "laurel_post_norm": "laurel.post_laurel_norm",
}
_TENSOR_RE = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)$")


def _per_layer(value: Any, n: int) -> list:
    return list(value) if isinstance(value, list) else [value] * n


def _sparsity(scale: float) -> float:
    """The sparsity whose Normal(0, 1) quantile is scale (0 for the dense layers' -inf)."""
    return 0.0 if scale == -math.inf else 0.5 * math.erfc(-scale / math.sqrt(2))


def gemma3n_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) completed for Gemma3nTextConfig."""
    kw = dict(kw)
    n = int(kw["num_hidden_layers"])
    tensors = {t.name: t for t in reader.tensors}
    window = field(reader, f"{arch}.attention.sliding_window")
    if window is None:
        raise ValueError(f"a {arch} GGUF without {arch}.attention.sliding_window")
    scales = field(reader, f"{arch}.activation_sparsity_scale")
    scales = [float(s) for s in _per_layer(scales, n)] if scales is not None else [-math.inf] * n
    ple = tensors.get("per_layer_token_embd.weight")
    laurel = tensors.get("blk.0.laurel_l.weight")
    if ple is None or laurel is None:
        raise ValueError(f"a {arch} GGUF without per_layer_token_embd or laurel_l tensors")
    kw.update(
        layer_types=layer_types(reader, arch, n),
        sliding_window=int(window),
        intermediate_size=[
            int(f) for f in _per_layer(field(reader, f"{arch}.feed_forward_length"), n)
        ],
        num_kv_shared_layers=int(field(reader, f"{arch}.attention.shared_kv_layers", 0) or 0),
        altup_active_idx=int(field(reader, f"{arch}.altup.active_idx", 0) or 0),
        altup_num_inputs=int(field(reader, f"{arch}.altup.num_inputs", 4)),
        hidden_size_per_layer_input=int(field(reader, f"{arch}.embedding_length_per_layer_input")),
        vocab_size_per_layer_input=int(ple.data.shape[0]),
        laurel_rank=int(laurel.data.shape[0]),
        activation_sparsity_pattern=[_sparsity(s) for s in scales],
        activation_sparsity_scale=scales,  # the multipliers themselves (models/gemma3n.py)
        final_logit_softcapping=field(reader, f"{arch}.final_logit_softcapping"),
        hidden_activation="gelu_pytorch_tanh",
    )
    kw.pop("rope_scaling", None)
    kw["rope_parameters"] = {
        "full_attention": {
            "rope_type": "default",
            "rope_theta": float(kw.pop("rope_theta", 1_000_000.0)),
        },
        "sliding_attention": {  # (llama.cpp's default for gemma3n where the file has none)
            "rope_type": "default",
            "rope_theta": float(field(reader, f"{arch}.rope.freq_base_swa", 10_000.0)),
        },
    }
    return kw


def gemma3n_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every tensor of the file, as loader.gguf_weights yields them."""
    from radixlm.model.gguf.tensors import read_experts

    for t in reader.tensors:
        m = _TENSOR_RE.match(t.name)
        if m is None:
            continue
        layer, base, suffix = m.groups()
        if layer is None and base in _STACKED:  # [A - 1, hidden, hidden]: one Linear each
            if keep is not None and not keep(f"{_STACKED[base]}.0.weight"):
                continue
            stacked = read_experts(t, False, None, _STACKED[base])
            for i, w in enumerate(stacked):
                yield f"{_STACKED[base]}.{i}.weight", w
            continue
        if layer is None:
            if base not in _TOP:
                continue
            name = f"{_TOP[base]}.{suffix}"
        else:
            hf = _LAYER.get(f"{base}.{suffix}") or (
                f"{_LAYER[base]}.{suffix}" if base in _LAYER else None
            )
            if hf is None:
                continue
            name = f"model.layers.{layer}.{hf}"
        if keep is not None and not keep(name):
            continue
        yield name, read(t, name, slicer(name) if slicer is not None else None)


GEMMA3N = GGUFArchitecture(
    HFModel("Gemma3nForCausalLM", "Gemma3nTextConfig"),
    config=gemma3n_config,
    weights=gemma3n_weights,
)
