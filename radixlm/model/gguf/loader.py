"""GGUF files (llama.cpp's format): HF config from metadata, HF-named weights, for any architecture
registry.py names, by its GGUFArchitecture (spec.py): the config keys every architecture shares are
read here, the family's own by its config mapping; the tensors renamed by its names (q / k
unpermuted, Gemma's norm offset taken off where it says) or yielded by its own iterator.

With keep_quantized, 2-D weights in a format the native kernels read
(radixlm.kernels.formats.FORMATS: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_XS, F16, BF16) stay as stored, F32 ones are plain float32, and any other type is refused
by name (no silent float32 copy at several times the file's memory); 1-D tensors (norms, biases) are
always float32. Without keep_quantized every tensor is dequantized to float32 at load with gguf's
own (vectorized numpy) kernels, so they equal what transformers' GGUF loader produces.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from radixlm.model.gguf.fields import field
from radixlm.model.gguf.registry import GGUF_ARCHITECTURE_REGISTRY
from radixlm.model.gguf.spec import GGUFArchitecture, TensorReader
from radixlm.model.gguf.tensors import read_weight, unpermute
from radixlm.model.tp_shard import Slicer

# {arch}.<key> -> HF config attribute
_CONFIG_KEYS = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([\w.]+)\.(weight|bias)$")  # `nextn.eh_proj` too
_TOP_RE = re.compile(r"^(\w+)\.(weight|bias)$")


def gguf_architecture(reader) -> str:
    """The file's general.architecture, or the error naming the ones radixlm reads."""
    arch = field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURE_REGISTRY:
        raise GGUF_ARCHITECTURE_REGISTRY.unknown(arch)
    return arch


def gguf_config(reader):
    """The transformers config the GGUF metadata describes."""
    import transformers

    arch = gguf_architecture(reader)
    spec = GGUF_ARCHITECTURE_REGISTRY.get(arch)
    kw: dict[str, Any] = {}
    for key, attr in _CONFIG_KEYS.items():
        value = field(reader, f"{arch}.{key}")
        if value is not None:
            kw[attr] = max(value) if isinstance(value, list) else value  # per-layer kv heads
    head_dim = field(reader, f"{arch}.attention.key_length") or field(
        reader, f"{arch}.rope.dimension_count"
    )
    if head_dim:
        kw["head_dim"] = head_dim
    tensor_names = {t.name for t in reader.tensors}
    if "vocab_size" not in kw:
        kw["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    kw["tie_word_embeddings"] = "output.weight" not in tensor_names
    for tok_key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        value = field(reader, f"tokenizer.ggml.{tok_key}")
        if value is not None:
            kw["pad_token_id" if tok_key == "padding_token_id" else tok_key] = value
    rope_scaling = _rope_scaling(reader, arch, kw, spec.llama3_rope_freqs)
    if rope_scaling:
        kw["rope_scaling"] = rope_scaling
    kw = spec.config(reader, arch, kw)
    model = spec.hf_model(reader, arch)
    config = getattr(transformers, model.config_class)(**kw)
    config.architectures = [model.architecture]
    return config


def _rope_scaling(reader, arch: str, kw: dict, llama3_rope_freqs: bool) -> dict | None:
    scaling_type = field(reader, f"{arch}.rope.scaling.type")
    if scaling_type in ("linear", "yarn"):
        out = {
            "rope_type": scaling_type,
            "factor": float(field(reader, f"{arch}.rope.scaling.factor", 1.0)),
        }
        orig = field(reader, f"{arch}.rope.scaling.original_context_length")
        if orig:
            out["original_max_position_embeddings"] = int(orig)
        return out
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None and llama3_rope_freqs:
        # Llama 3.1+: llama.cpp bakes llama3 scaling into per-frequency factors
        return _llama3_from_rope_freqs(np.asarray(freqs.data, dtype=np.float32), kw)
    return None


def _llama3_from_rope_freqs(factors: np.ndarray, kw: dict) -> dict:
    """Recover HF's llama3 rope_scaling from llama.cpp's rope_freqs; verified, not guessed."""
    from radixlm.model.layers.rotary import compute_inv_freq

    head_dim = kw.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
    base = {"rope_type": "default", "rope_theta": kw.get("rope_theta", 10000.0)}
    params = dict(
        base,
        rope_type="llama3",
        factor=float(factors.max()),
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    default, _ = compute_inv_freq(base, head_dim, 0)
    scaled, _ = compute_inv_freq(params, head_dim, 0)
    if not np.allclose((default / scaled).numpy(), factors, rtol=1e-3):
        raise ValueError(
            "GGUF rope_freqs do not match llama3 rope scaling (low 1, high 4, original 8192)"
        )
    del params["rope_theta"]
    return params


def gguf_weights(
    reader,
    config,
    keep_quantized: bool = False,
    slicer: Slicer | None = None,
    keep: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, Any]]:
    """(HF name, tensor) for every model tensor, one at a time (peak memory stays at the model
    plus one tensor): a QuantizedTensor for 2-D tensors in a kernel format when keep_quantized
    (ValueError for a 2-D type with no kernel other than F32), else float32. Single-threaded on
    purpose: numpy's dequant kernels are memory-bound and threads made them slower here.
    slicer (tensor parallelism): HF name -> the part of the tensor this rank holds; only that part
    is read from the file (shard.py). keep (a pipeline stage): the HF names read at all."""
    spec = GGUF_ARCHITECTURE_REGISTRY.get(field(reader, "general.architecture"))
    read = functools.partial(read_weight, keep_quantized=keep_quantized)
    weights = spec.weights or functools.partial(named_weights, spec=spec)
    yield from weights(reader, config, read, slicer, keep)


def named_weights(
    reader,
    config,
    read: TensorReader,
    slicer: Slicer | None,
    keep: Callable[[str], bool] | None,
    spec: GGUFArchitecture,
) -> Iterator[tuple[str, Any]]:
    """The tensors renamed by spec.tensor_names, with the spec's transforms."""
    for t in reader.tensors:
        name = _hf_name(t.name, spec.tensor_names)
        if name is None or (
            keep is not None and not keep(name)
        ):  # rope_freqs (read into the config) and the like
            continue
        full_rows = t.data.shape[0]
        w = read(t, name, slicer(name) if slicer is not None else None)
        if spec.unpermute_qk and ".self_attn.q_proj." in name:
            w = _unpermute_rows(w, config.num_attention_heads, full_rows)
        elif spec.unpermute_qk and ".self_attn.k_proj." in name:
            w = _unpermute_rows(w, config.num_key_value_heads, full_rows)
        elif spec.norm_offset and name.endswith("norm.weight"):
            w = w - 1  # exact for the stored fl(1 + w): OffsetRMSNorm adds the 1 back
        yield name, w


def _hf_name(name: str, names: Mapping[str, str]) -> str | None:
    m = _BLOCK_RE.match(name)
    if m:
        hf = names.get(m.group(2))
        return None if hf is None else f"{hf.format(m.group(1))}.{m.group(3)}"
    m = _TOP_RE.match(name)
    if m and m.group(1) in names:
        return f"{names[m.group(1)]}.{m.group(2)}"
    return None


def _unpermute_rows(w, n_head: int, full_rows: int):
    """unpermute over the heads this rank's slice holds (of n_head in full_rows rows)."""
    from radixlm.model.layers.quantized import QuantizedTensor

    rows = w.data.shape[0] if isinstance(w, QuantizedTensor) else w.shape[0]
    return unpermute(w, n_head * rows // full_rows)


def gguf_eos_token_ids(reader) -> list[int]:
    ids = [
        field(reader, f"tokenizer.ggml.{k}")
        for k in ("eos_token_id", "eot_token_id", "eom_token_id")
    ]
    return list(dict.fromkeys(i for i in ids if i is not None))


def gguf_chat_template(reader) -> str | None:
    return field(reader, "tokenizer.chat_template")
