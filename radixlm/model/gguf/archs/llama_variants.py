"""llama.cpp's GGUFs of the dense families built on Llama's layer (issue 90): exaone4, seed_oss,
apertus, arcee, mistral3 (Ministral 3), ernie4_5 and hunyuan-dense, read as their HF models.

What the converter does per family: arcee and mistral3 are its LlamaModel (q / k rows permuted
for GGML's RoPE, undone at load); apertus is a LlamaModel without the permutation whose xIELU
parameters go to per-layer metadata arrays (xielu.alpha_p, alpha_n, beta, eps: read back into
the activation's tensors here); exaone4, seed_oss, ernie4_5 and hunyuan-dense (its NTK-alpha RoPE
written as the stretched base) are plain TextModels (ERNIE's q / k
rows stay in HF's interleaved-pair order, which models/ernie4_5.py reorders for every source).
exaone4 writes its window and per-layer pattern where the checkpoint has a window; mistral3 writes
Ministral 3's YaRN (rope.scaling.yarn_log_multiplier: mscale_all_dim) and its attention
temperature (attention.temperature_scale: llama_4_scaling_beta), which a Mistral Small text
model written as mistral3 lacks (read as Mistral). llama.cpp's exaone4 graph windows a model only
at 64 layers (EXAONE 4.0 32B, the one hybrid checkpoint); radixlm windows whatever file says so,
as HF does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from radixlm.model.gguf.archs.olmo import OLMO2_TENSOR_NAMES
from radixlm.model.gguf.fields import field, has_tensor, layer_types
from radixlm.model.gguf.spec import TENSOR_NAMES, GGUFArchitecture, HFModel, Variant
from radixlm.model.tp_shard import Slicer, TensorSlice

EXAONE4_SWA_PERIOD = 4  # llama.cpp's pattern where the file has none


def single_rope(kw: dict) -> dict:
    """kw with the file's one RoPE (base and scaling) as HF's rope_parameters."""
    kw = dict(kw)
    rope = dict(kw.pop("rope_scaling", None) or {"rope_type": "default"})
    rope["rope_theta"] = float(kw.pop("rope_theta", 10_000.0))
    return dict(kw, rope_parameters=rope)


def exaone4_config(reader, arch: str, kw: dict) -> dict:
    kw = single_rope(kw)
    n = kw["num_hidden_layers"]
    window = field(reader, f"{arch}.attention.sliding_window")
    if not window:
        return dict(kw, sliding_window=None, layer_types=["full_attention"] * n)
    types = layer_types(reader, arch, n, EXAONE4_SWA_PERIOD)
    return dict(kw, sliding_window=int(window), layer_types=types)


def seed_oss_config(reader, arch: str, kw: dict) -> dict:
    return dict(
        single_rope(kw),
        attention_bias=has_tensor(reader, "attn_q.bias"),
        attention_out_bias=has_tensor(reader, "attn_output.bias"),
        mlp_bias=has_tensor(reader, "ffn_up.bias"),
    )


def ernie4_5_config(reader, arch: str, kw: dict) -> dict:
    return dict(single_rope(kw), use_bias=has_tensor(reader, "attn_q.bias"))


def mistral3_config(reader, arch: str, kw: dict) -> dict:
    """Ministral 3's YaRN and attention temperature, Mistral's window where the file has one."""
    kw = single_rope(kw)
    window = field(reader, f"{arch}.attention.sliding_window")
    if window:
        kw["sliding_window"] = int(window)
    temperature = field(reader, f"{arch}.attention.temperature_scale")
    if temperature is None:  # a Mistral Small text model: Mistral's graph
        return kw
    rope = kw["rope_parameters"]
    if rope["rope_type"] != "yarn":
        raise ValueError(
            f"{arch}.attention.temperature_scale with rope type {rope['rope_type']!r}: Ministral"
            " 3's attention temperature comes with YaRN (rope.scaling.type yarn)"
        )
    for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        rope[key] = float(field(reader, f"{arch}.rope.scaling.yarn_{key}", default))
    rope["mscale"] = 1.0  # llama.cpp's, beside the file's log multiplier
    rope["mscale_all_dim"] = float(field(reader, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0))
    rope["llama_4_scaling_beta"] = float(temperature)
    return kw


def _is_mistral(reader, arch: str) -> bool:
    return field(reader, f"{arch}.attention.temperature_scale") is None


# xIELU's parameters: HF's tensor -> llama.cpp's per-layer metadata array (not under the arch)
XIELU_KEYS = {p: f"xielu.{p}" for p in ("alpha_p", "alpha_n", "beta", "eps")}


def apertus_weights(
    reader,
    config,
    read: Callable[[Any, str, TensorSlice | None], Any],
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """The tensors by name, then each layer's xIELU parameters from the metadata (HF's shapes:
    alpha_p / alpha_n [1], beta / eps scalars)."""
    from radixlm.model.gguf.loader import named_weights

    yield from named_weights(reader, config, read, slicer, keep, spec=APERTUS_TENSORS)
    n = config.num_hidden_layers
    for param, key in XIELU_KEYS.items():
        values = per_layer_floats(reader, key, n)
        for i, v in enumerate(values):
            name = f"model.layers.{i}.mlp.act_fn.{param}"
            if keep is None or keep(name):
                t = torch.tensor(v, dtype=torch.float32)
                yield name, t.reshape(1) if param.startswith("alpha") else t


def per_layer_floats(reader, key: str, n_layers: int) -> list[float]:
    value = field(reader, key)
    if value is None:
        raise ValueError(f"apertus GGUF without {key}")
    values = value if isinstance(value, list) else [value] * n_layers  # llama.cpp: key or array
    if len(values) != n_layers:
        raise ValueError(f"apertus GGUF: {key} must list one value per layer ({n_layers})")
    return [float(v) for v in values]


EXAONE4 = GGUFArchitecture(
    HFModel("Exaone4ForCausalLM", "Exaone4Config"),
    config=exaone4_config,
    tensor_names=OLMO2_TENSOR_NAMES,  # post_attention_norm, post_ffw_norm
)
SEED_OSS = GGUFArchitecture(
    HFModel("SeedOssForCausalLM", "SeedOssConfig"),
    config=seed_oss_config,
    # its post_attention_norm is HF's post_attention_layernorm: the norm before the MLP
    tensor_names=dict(TENSOR_NAMES, post_attention_norm="model.layers.{}.post_attention_layernorm"),
)
APERTUS_TENSORS = GGUFArchitecture(
    HFModel("ApertusForCausalLM", "ApertusConfig"),
    config=lambda reader, arch, kw: single_rope(kw),
    tensor_names=dict(
        TENSOR_NAMES,
        attn_norm="model.layers.{}.attention_layernorm",
        ffn_norm="model.layers.{}.feedforward_layernorm",
    ),
)
APERTUS = dataclasses.replace(APERTUS_TENSORS, weights=apertus_weights)
ARCEE = GGUFArchitecture(
    HFModel("ArceeForCausalLM", "ArceeConfig"),
    config=lambda reader, arch, kw: single_rope(kw),
    unpermute_qk=True,
)
MISTRAL3 = GGUFArchitecture(
    HFModel("Ministral3ForCausalLM", "Ministral3Config"),
    config=mistral3_config,
    variants=(Variant(HFModel("MistralForCausalLM", "MistralConfig"), _is_mistral),),
    unpermute_qk=True,
)
ERNIE4_5 = GGUFArchitecture(
    HFModel("Ernie4_5ForCausalLM", "Ernie4_5Config"), config=ernie4_5_config
)
HUNYUAN_DENSE = GGUFArchitecture(
    HFModel("HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config"),
    config=lambda reader, arch, kw: single_rope(kw),  # the NTK-alpha base, written stretched
    tensor_names=dict(
        TENSOR_NAMES,
        attn_q_norm="model.layers.{}.self_attn.query_layernorm",
        attn_k_norm="model.layers.{}.self_attn.key_layernorm",
    ),
)
