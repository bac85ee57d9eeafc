"""A pre-quantized HF checkpoint's `quantization_config` (config.json), parsed: AWQ (AutoAWQ's GEMM
layout) and GPTQ (AutoGPTQ / GPTQModel) are read and repacked into the native CPU formats at load
(model/awq_gptq.py), gpt-oss's MXFP4 experts too (model/mxfp4_checkpoint.py), FP8 in
llm-compressor's layout (compressed-tensors, float-quantized) and in DeepSeek's / transformers'
FineGrainedFP8 one (quant_method fp8: model/fp8_checkpoint.py); anything else is refused at
start-up in one line naming the scheme and field.

As vLLM and SGLang do, the checkpoint's own quant_method selects the method when --quantization is
not given; naming another one for such a checkpoint is refused (its weights are not float).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

# quant_method "fp8" loads as `fp8_serialized` (SGLang's is_checkpoint_fp8_serialized): radixlm's
# `--quantization fp8` is also the CUDA method that quantizes float weights at load, so the
# checkpoint's loader needs a name of its own; `--quantization fp8` still selects it for such a
# checkpoint, as in SGLang (resolve_checkpoint_quantization).
FP8_SERIALIZED = "fp8_serialized"
# The --quantization values (quant_methods' registry names) that read a pre-quantized checkpoint;
# the rest of a checkpoint's quant_method names are refused.
CHECKPOINT_METHODS = ("awq", "gptq", "mxfp4", "compressed-tensors", FP8_SERIALIZED)
# A loader's config.json quant_method where the two names differ.
QUANT_METHOD_OF = {FP8_SERIALIZED: "fp8"}


@dataclass(frozen=True)
class CheckpointQuant:
    """What the loader needs of a supported quantization_config."""

    method: str  # one of CHECKPOINT_METHODS
    bits: int  # 4 (AWQ, GPTQ, MXFP4) or 8 (GPTQ)
    group_size: int  # input rows per scale; -1: one scale per output row (per channel)
    desc_act: bool  # GPTQ act-order: g_idx not sorted, the input is permuted at run time
    sym: bool
    # GPTQ v1 (AutoGPTQ, GPTQModel's "gptq") stores each zero minus 1; v2 ("gptq_v2") stores it.
    zero_offset: int
    # FP8: how the weight scale is laid out ("channel", "block", "tensor"), and a block's
    # [rows, cols].
    strategy: str = ""
    block: tuple[int, int] = (0, 0)

    @property
    def pack(self) -> int:
        """Values per int32."""
        return 32 // self.bits

    @property
    def quant_method(self) -> str:
        """config.json's name of the method (SGLang's --quantization value for it)."""
        return QUANT_METHOD_OF.get(self.method, self.method)


def _refuse(method: str, field: str, value: Any, supported: str) -> ValueError:
    return ValueError(
        f"quantization_config quant_method {method!r}: {field} {value!r} is not supported"
        f" ({supported})"
    )


def _group_size(method: str, value: Any) -> int:
    # Blocks of 32 values carry one scale (formats.py): a group must be whole blocks.
    size = int(value)
    if size != -1 and (size <= 0 or size % 32):
        raise _refuse(method, "group_size", value, "a multiple of 32, or -1 per channel")
    return size


def _parse_awq(cfg: dict) -> CheckpointQuant:
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse("awq", "version", version, "gemm")
    bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
    if bits != 4:
        raise _refuse("awq", "bits", bits, "4")
    if not cfg.get("zero_point", True):
        raise _refuse("awq", "zero_point", False, "true")
    group = _group_size("awq", cfg.get("group_size", cfg.get("q_group_size", 128)))
    return CheckpointQuant("awq", bits, group, desc_act=False, sym=False, zero_offset=0)


def _parse_gptq(cfg: dict) -> CheckpointQuant:
    bits = int(cfg.get("bits", 4))
    if bits not in (4, 8):
        raise _refuse("gptq", "bits", bits, "4 or 8")
    fmt = str(cfg.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise _refuse("gptq", "checkpoint_format", fmt, "gptq or gptq_v2")
    if cfg.get("is_marlin_format"):
        raise _refuse("gptq", "is_marlin_format", True, "false")
    if cfg.get("dynamic"):  # GPTQModel's per-module overrides (bits, group size per layer)
        raise _refuse("gptq", "dynamic", "per-module overrides", "none")
    sym = bool(cfg.get("sym", True))
    if bits == 8 and not sym:  # (q - z) spans 9 bits: no int8 block format holds it
        raise _refuse("gptq", "sym", False, "true with bits 8")
    return CheckpointQuant(
        "gptq",
        bits,
        _group_size("gptq", cfg.get("group_size", 128)),
        desc_act=bool(cfg.get("desc_act", False)),
        sym=sym,
        zero_offset=1 if fmt == "gptq" else 0,
    )


def _parse_compressed_tensors(cfg: dict) -> CheckpointQuant:
    method = "compressed-tensors"
    fmt = str(cfg.get("format", "")).lower()
    if fmt not in ("float-quantized", "naive-quantized"):
        raise _refuse(method, "format", fmt, "float-quantized: FP8 weights")
    if cfg.get("kv_cache_scheme"):
        raise _refuse(method, "kv_cache_scheme", "FP8 KV scales", "none")
    if cfg.get("sparsity_config"):
        raise _refuse(method, "sparsity_config", "sparse weights", "none")
    groups = cfg.get("config_groups") or {}
    schemes = {json_key(g.get("weights")) for g in groups.values()}
    if len(schemes) != 1:
        raise _refuse(method, "config_groups", f"{len(schemes)} weight schemes", "one")
    w = next(iter(groups.values())).get("weights") or {}
    fp8 = (("type", "float"), ("num_bits", 8), ("symmetric", True), ("dynamic", False))
    for field, want in fp8:
        if w.get(field, want) != want:
            raise _refuse(method, f"weights.{field}", w.get(field), f"{want}: FP8 e4m3 weights")
    strategy = str(w.get("strategy", "tensor")).lower()
    block = (0, 0)
    if strategy == "block":
        bn, bk = (int(v) for v in w.get("block_structure") or (0, 0))
        if bn <= 0 or bk <= 0 or bk % 128:
            raise _refuse(method, "block_structure", [bn, bk], "[n, k] with k a multiple of 128")
        block = (bn, bk)
    elif strategy not in ("channel", "tensor"):
        raise _refuse(method, "weights.strategy", strategy, "channel, block or tensor")
    return CheckpointQuant(method, 8, -1, False, True, 0, strategy=strategy, block=block)


def _parse_fp8(cfg: dict) -> CheckpointQuant:
    """transformers' FineGrainedFP8Config, SGLang's and vLLM's Fp8Config, serialized: e4m3 weights,
    with weight_block_size a float32 `weight_scale_inv` per [bn, bk] block (the multiplier: w = q *
    scale_inv, transformers' Fp8Dequantize), without it one scale per tensor (`weight_scale`,
    vLLM's and SGLang's; transformers' `weight_scale_inv`)."""
    method = "fp8"
    fmt = str(cfg.get("fmt") or "e4m3").lower()
    if fmt != "e4m3":  # DeepSeek's config spells it; e5m2 weights have no kernel here
        raise _refuse(method, "fmt", fmt, "e4m3")
    scheme = str(cfg.get("activation_scheme") or "dynamic").lower()
    if scheme not in ("dynamic", "static"):
        raise _refuse(method, "activation_scheme", scheme, "dynamic or static")
    for field, supported in (
        ("kv_cache_quant_algo", "none: FP8 KV scales"),
        ("modules_to_convert", "none: FP8 embeddings"),
    ):
        if cfg.get(field):
            raise _refuse(method, field, cfg[field], supported)
    if str(cfg.get("expert_dtype") or "fp8").lower() != "fp8":
        raise _refuse(method, "expert_dtype", cfg["expert_dtype"], "fp8")
    if str(cfg.get("scale_fmt") or "float").lower() not in ("float", "ue8m0"):
        raise _refuse(method, "scale_fmt", cfg["scale_fmt"], "float or ue8m0")
    size = cfg.get("weight_block_size")
    if size is None:
        return CheckpointQuant(FP8_SERIALIZED, 8, -1, False, True, 0, strategy="tensor")
    if scheme != "dynamic":  # as SGLang's Fp8Config: block scales come with dynamic activations
        raise _refuse(method, "activation_scheme", scheme, "dynamic with weight_block_size")
    try:
        bn, bk = (int(v) for v in size)
    except (TypeError, ValueError):
        bn = bk = 0
    if bn <= 0 or bk <= 0 or bk % 128:
        raise _refuse(method, "weight_block_size", size, "[n, k] with k a multiple of 128")
    return CheckpointQuant(FP8_SERIALIZED, 8, -1, False, True, 0, strategy="block", block=(bn, bk))


def json_key(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def parse_quantization_config(cfg: dict | None) -> CheckpointQuant | None:
    """The parsed config, None for a checkpoint without one; ValueError for a scheme or field this
    loader does not read (named in the message)."""
    if not cfg:
        return None
    method = str(cfg.get("quant_method", "")).lower()
    if method == "awq":
        return _parse_awq(cfg)
    if method == "gptq":
        return _parse_gptq(cfg)
    if method == "mxfp4":  # e2m1 values with an e8m0 exponent per 32: nothing else to choose
        return CheckpointQuant("mxfp4", 4, 32, desc_act=False, sym=True, zero_offset=0)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(cfg)
    if method == "fp8":
        return _parse_fp8(cfg)
    names = (QUANT_METHOD_OF.get(m, m) for m in CHECKPOINT_METHODS)
    raise ValueError(
        f"quantization_config quant_method {method!r} is not supported (pre-quantized"
        f" checkpoints: {', '.join(names)})"
    )


def checkpoint_quant(config: Any) -> CheckpointQuant | None:
    """The parsed quantization_config of a transformers config (a dict or an object with
    to_dict())."""
    cfg = getattr(config, "quantization_config", None)
    if cfg is not None and not isinstance(cfg, dict):
        cfg = cfg.to_dict()
    return parse_quantization_config(cfg)


def declared_quant_method(model_path: str | None) -> str | None:
    """The quant_method a local model directory's config.json names (None: none, or no such
    directory): read before anything loads, to tell `--quantization fp8` for an FP8 checkpoint from
    the CUDA method (quant_methods.refusal)."""
    path = os.path.join(model_path or "", "config.json")
    if not model_path or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            cfg = json.load(f).get("quantization_config") or {}
    except (OSError, ValueError, AttributeError):
        return None  # the loader names what is wrong with the file
    return str(cfg.get("quant_method", "")).lower() or None


def resolve_checkpoint_quantization(quantization: str | None, quant: CheckpointQuant | None) -> str:
    """--quantization for a HF directory given its parsed config: the checkpoint's own method when
    unset; a mismatch either way is refused (one line)."""
    if quant is None:
        if quantization in CHECKPOINT_METHODS:
            raise ValueError(
                f"--quantization {quantization} reads a pre-quantized checkpoint; this one has no"
                " quantization_config"
            )
        return quantization or "none"
    if quantization not in (None, quant.method, quant.quant_method):
        raise ValueError(
            f"--quantization {quantization}: the checkpoint is quantized with quant_method"
            f" {quant.quant_method!r} (its weights are not float); leave --quantization unset or"
            f" pass {quant.quant_method}"
        )
    return quant.method
