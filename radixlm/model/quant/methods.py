"""--quantization as method objects: each value names a QuantMethod, which says where it runs and
what it makes of a model's weights at load; the loader and the runner ask the method, never the
value (vLLM's and SGLang's QuantizationConfig / LinearMethod split, at this project's size).

- `gguf` (NativeMethod): a GGUF file's own block formats, kept as they are by the GGUF reader.
- `int8`, `q4_0`, `q8_0`, `q4_k`, `f16`, `bf16` (NativeMethod): quantized at load into the native
  CPU kernels' formats, each matrix as it streams in, then whatever was left (tied or random
  weights; MoE experts per expert). Elsewhere (CUDA, no native kernels) the weights run in float,
  with a warning.
- `fp8` (Fp8Method): each linear layer's weight as float8_e4m3fn with a float32 scale per output
  row, multiplied by a Triton W8A16 GEMM (layers/fp8_linear.py); CUDA only (refused elsewhere at
  start-up). The embeddings, the LM head and MoE experts stay in the model dtype.
- `awq`, `gptq` (awq_gptq.CheckpointMethod): a pre-quantized checkpoint's own packed 4- / 8-bit
  weights, repacked into the native formats at load; CPU only (refused elsewhere at start-up). The
  checkpoint's config.json selects it.
- `mxfp4` (mxfp4_checkpoint.Mxfp4Method): gpt-oss's released checkpoints, their experts' MXFP4
  blocks repacked into GGML's MXFP4 layout for the native kernel; CPU only, selected by config.json.
- `compressed-tensors` (compressed_tensors.CompressedTensorsMethod): llm-compressor's checkpoints,
  its integer formats (pack-quantized W4A16 / W8A16, int-quantized W8A8) repacked into the native
  formats at load as AWQ / GPTQ are, its FP8 one as below; CPU only, selected by config.json.
- `compressed-tensors` FP8, `fp8_serialized` (fp8_checkpoint.Fp8CheckpointMethod): FP8 checkpoints,
  llm-compressor's and DeepSeek's / transformers' FineGrainedFP8 (quant_method fp8), their e4m3
  weights kept as they are for the native FP8 kernel (float32 activations); CPU only, selected by
  config.json. `--quantization fp8` selects `fp8_serialized` for a checkpoint whose quant_method is
  fp8 (SGLang's reading of it), the CUDA method for float weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from radixlm.kernels.formats import FORMATS, QUANTIZE_AT_LOAD
from radixlm.model.quant.checkpoint import FP8_SERIALIZED, QUANT_METHOD_OF, declared_quant_method
from radixlm.model.traits import QuantizesWeights
from radixlm.registry import Registry

logger = logging.getLogger(__name__)


class QuantMethod:
    name: str
    # Where it cannot run: refused at start-up (True), or the weights run in float (False).
    refused_elsewhere = False
    # kv_cache_dtype auto: float16 where every attention backend in use reads it (the native CPU
    # kernels' choice, llama.cpp's), else the model dtype.
    float16_kv = False

    def unavailable_reason(self, device: torch.device) -> str | None:
        """None where the method runs on `device`, else why not (said with the value's name)."""
        return None

    def while_loading(
        self, weights: Iterator[tuple[str, Any]], model: nn.Module
    ) -> Iterator[tuple[str, Any]]:
        """The checkpoint's (name, tensor) pairs as the model takes them (quantized or not)."""
        return weights

    def after_loading(self, model: nn.Module) -> None:
        """Once every weight is in: what is left to quantize."""


def native_unavailable_reason(device: torch.device) -> str | None:
    """Why the native CPU kernels cannot run on `device` (None: they can)."""
    from radixlm import kernels

    if device.type != "cpu":
        return f"runs on the native CPU kernels only, not {device.type}"
    if not kernels.available():
        return f"needs the native CPU kernels ({kernels.unavailable_reason()})"
    return None


class NativeMethod(QuantMethod):
    """The native CPU kernels' formats: a GGUF's own (`gguf`) or one made at load."""

    float16_kv = True

    def __init__(self, name: str):
        self.name = name
        self.at_load = name in QUANTIZE_AT_LOAD

    def unavailable_reason(self, device: torch.device) -> str | None:
        why = native_unavailable_reason(device)
        if why is None:
            return None
        return (
            f"runs on the native CPU kernels only; {device.type} runs in float"
            if device.type != "cpu"
            else why + "; running in float"
        )

    def while_loading(self, weights, model):
        """Each matrix the model multiplies by, quantized as it streams in: only one tensor is ever
        held in float, so a bf16 8B checkpoint never needs its fp32 size in memory. Logs the time
        spent quantizing."""
        if not self.at_load:
            return weights
        return self._quantized(weights, model)

    def _quantized(self, weights, model):
        from radixlm.model.layers.quantized import QuantizedTensor

        fmt, count, seconds = FORMATS[self.name], 0, 0.0
        for name, tensor in weights:
            if tensor.dim() == 2 and fmt.supports(tensor.shape[1]) and model.takes_quantized(name):
                t0 = time.perf_counter()
                tensor = QuantizedTensor.quantize(tensor, self.name)
                seconds, count = seconds + time.perf_counter() - t0, count + 1
            yield name, tensor
        logger.info("quantized %d matrices to %s in %.2f s", count, self.name, seconds)

    def after_loading(self, model: nn.Module) -> None:
        if not self.at_load:
            return
        from radixlm.model.layers.linear import quantize_module_weights

        skipped = quantize_module_weights(model, self.name)
        # MoE experts: quantized per expert (layers/moe/moe_block.py).
        for module in model.modules():
            if isinstance(module, QuantizesWeights):
                module.quantize_weights(self.name)
        if skipped:
            logger.warning(
                "--quantization %s: %d layers stay float (input size not a multiple of the"
                " block): %s",
                self.name,
                len(skipped),
                ", ".join(skipped[:4]),
            )


class Fp8Method(QuantMethod):
    """FP8 weights, W8A16 (vLLM's / SGLang's online `fp8` of a 16-bit checkpoint, weight-only):
    every linear layer but the LM head quantized once loaded, on the device (block: 0 for a scale
    per output row, 128 for 128 x 128 block scales, the same kernel)."""

    refused_elsewhere = True

    def __init__(self, name: str = "fp8", block: int = 0):
        self.name, self.block = name, block

    def unavailable_reason(self, device: torch.device) -> str | None:
        from radixlm.kernels import triton_ops

        why = triton_ops.unavailable_reason(device)
        return None if why is None else f"is CUDA-only (a Triton GEMM): {why}"

    def after_loading(self, model: nn.Module) -> None:
        from radixlm.model.layers.fp8_linear import Fp8Matrix
        from radixlm.model.layers.linear import Linear

        t0, count = time.perf_counter(), 0
        for name, module in model.named_modules():
            if (
                isinstance(module, Linear)
                and module.qweight is None
                and name.rpartition(".")[2] != "lm_head"
            ):
                module.set_matrix(Fp8Matrix.quantize(module.weight, self.block))
                count += 1
        logger.info(
            "quantized %d linear layers to fp8 (%s) in %.2f s; the embeddings and the LM head stay"
            " in the model dtype",
            count,
            f"{self.block}x{self.block} blocks" if self.block else "a scale per output row",
            time.perf_counter() - t0,
        )


# --quantization's values (none: float weights, no method); a new method is one registration.
QUANTIZATION_REGISTRY: Registry[QuantMethod, None] = Registry("quantization")
QUANTIZATION_REGISTRY.register("gguf", NativeMethod("gguf"))
for _name in QUANTIZE_AT_LOAD:
    QUANTIZATION_REGISTRY.register(_name, NativeMethod(_name))
QUANTIZATION_REGISTRY.register("fp8", Fp8Method())
# Pre-quantized checkpoints, selected by their config.json's quantization_config (loader.py).
QUANTIZATION_REGISTRY.register("awq", "radixlm.model.quant.awq_gptq:AWQ")
QUANTIZATION_REGISTRY.register("gptq", "radixlm.model.quant.awq_gptq:GPTQ")
QUANTIZATION_REGISTRY.register("mxfp4", "radixlm.model.quant.mxfp4_checkpoint:MXFP4")
QUANTIZATION_REGISTRY.register(
    "compressed-tensors", "radixlm.model.quant.compressed_tensors:COMPRESSED_TENSORS"
)
QUANTIZATION_REGISTRY.register(FP8_SERIALIZED, "radixlm.model.quant.fp8_checkpoint:FP8_SERIALIZED")
QUANTIZATIONS = ("none", *QUANTIZATION_REGISTRY.names())


def quant_method(quantization: str | None) -> QuantMethod | None:
    """The method of a --quantization value; None for float weights (none, or no value)."""
    if quantization is None or quantization == "none":
        return None
    return QUANTIZATION_REGISTRY.get(quantization)


def refusal(
    quantization: str | None, device: str | torch.device, model_path: str | None = None
) -> str | None:
    """Why --quantization cannot start on `device` (one line), or None: only a method that is
    refused elsewhere (fp8 off CUDA) is; the native formats fall back to float at load. A value
    that also names a local checkpoint's own quant_method (fp8 for an FP8 checkpoint) is left to
    the loader, which selects the checkpoint's method (checkpoint.py)."""
    method = quant_method(quantization) if quantization in (None, *QUANTIZATIONS) else None
    if method is None or not method.refused_elsewhere:
        return None
    why = method.unavailable_reason(torch.device(device))
    if why is None:
        return None
    declared = declared_quant_method(model_path)
    if declared == quantization and declared in QUANT_METHOD_OF.values():
        return None
    return f"--quantization {quantization} {why}"
