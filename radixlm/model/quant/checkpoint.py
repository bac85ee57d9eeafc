"""A pre-quantized HF checkpoint's `quantization_config` (config.json), parsed by the parser its
quant_method registers (CHECKPOINT_PARSER_REGISTRY), in its method's module: AWQ (AutoAWQ's GEMM
layout) and GPTQ (AutoGPTQ / GPTQModel) are read and repacked into the native CPU formats at load
(quant/awq_gptq.py), gpt-oss's MXFP4 experts too (quant/mxfp4_checkpoint.py), llm-compressor's
integer formats (compressed-tensors pack-quantized and int-quantized: quant/compressed_tensors.py),
FP8 in its float-quantized layout and in DeepSeek's / transformers' FineGrainedFP8 one
(quant_method fp8: quant/fp8_checkpoint.py); anything else is refused at
start-up in one line naming the scheme and field.

As vLLM and SGLang do, the checkpoint's own quant_method selects the method when --quantization is
not given; naming another one for such a checkpoint is refused (its weights are not float).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.registry import Registry

# quant_method "fp8" loads as `fp8_serialized` (SGLang's is_checkpoint_fp8_serialized): radixlm's
# `--quantization fp8` is also the CUDA method that quantizes float weights at load, so the
# checkpoint's loader needs a name of its own; `--quantization fp8` still selects it for such a
# checkpoint, as in SGLang (resolve_checkpoint_quantization).
FP8_SERIALIZED = "fp8_serialized"
# The --quantization values (methods.py's registry names) that read a pre-quantized checkpoint;
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
    # compressed-tensors: the weights' format (float-quantized, pack-quantized, int-quantized...).
    fmt: str = ""

    @property
    def pack(self) -> int:
        """Values per int32."""
        return 32 // self.bits

    @property
    def quant_method(self) -> str:
        """config.json's name of the method (SGLang's --quantization value for it)."""
        return QUANT_METHOD_OF.get(self.method, self.method)


def refuse(method: str, field: str, value: Any, supported: str) -> ValueError:
    """The error for a quantization_config field this loader does not read, naming it."""
    return ValueError(
        f"quantization_config quant_method {method!r}: {field} {value!r} is not supported"
        f" ({supported})"
    )


def group_size(method: str, value: Any) -> int:
    """A group size (input rows per scale) the native blocks hold; -1: one scale per row."""
    # Blocks of 32 values carry one scale (formats.py): a group must be whole blocks.
    size = int(value)
    if size != -1 and (size <= 0 or size % 32):
        raise refuse(method, "group_size", value, "a multiple of 32, or -1 per channel")
    return size


# config.json's quant_method -> its parser (cfg -> CheckpointQuant, ValueError naming a field it
# does not read), in the method's own module; the names' order is the unsupported error's.
CHECKPOINT_PARSER_REGISTRY: Registry[Callable[[dict], CheckpointQuant], None] = Registry(
    "checkpoint quantization",
    unknown="quantization_config quant_method {name!r} is not supported (pre-quantized"
    " checkpoints: {choices})",
)
CHECKPOINT_PARSER_REGISTRY.register("awq", "radixlm.model.quant.awq_gptq:parse_awq")
CHECKPOINT_PARSER_REGISTRY.register("gptq", "radixlm.model.quant.awq_gptq:parse_gptq")
CHECKPOINT_PARSER_REGISTRY.register("mxfp4", "radixlm.model.quant.mxfp4_checkpoint:parse_mxfp4")
CHECKPOINT_PARSER_REGISTRY.register(
    "compressed-tensors", "radixlm.model.quant.compressed_tensors:parse_compressed_tensors"
)
CHECKPOINT_PARSER_REGISTRY.register("fp8", "radixlm.model.quant.fp8_checkpoint:parse_fp8")


def json_key(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def parse_quantization_config(cfg: dict | None) -> CheckpointQuant | None:
    """The parsed config, None for a checkpoint without one; ValueError for a scheme or field this
    loader does not read (named in the message)."""
    if not cfg:
        return None
    method = str(cfg.get("quant_method", "")).lower()
    return CHECKPOINT_PARSER_REGISTRY.get(method)(cfg)


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
    the CUDA method (methods.refusal)."""
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
