"""`compressed-tensors`: FP8 checkpoints as llm-compressor writes them (config.json
quantization_config quant_method "compressed-tensors", format "float-quantized": the FP8_DYNAMIC,
FP8 and FP8_BLOCK schemes). Each quantized linear layer is `<layer>.weight`, float8_e4m3fn
[out, in], and `<layer>.weight_scale`, float32 or 16-bit: [out, 1] per channel, [ceil(out / bn),
ceil(in / bk)] per [bn, bk] block, or one value per tensor. The weights stay e4m3 on the native
CPU kernel (kernels/formats.py: fp8_e4m3, a float32 scale per 128 values beside the bytes as
stored), so the held model is the file's size plus 3%; the scale each 128 values take is the
checkpoint's own, so x = q * s is what HF's dequantization computes, bit for bit.

Activations stay float32 whatever `input_activations` says (dynamic per-token or static FP8
activations are what a GPU's FP8 GEMM needs; on the CPU the weight is the one rounding), and a
static scheme's `input_scale` tensors are read past. The layers in `ignore` (the LM head, routers)
are 16-bit in the file and stay 16-bit on the f16 / bf16 kernels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.kernels.formats import FORMATS, FP8_BLOCK, fp8_rows
from radixlm.model.awq_gptq import CheckpointMethod
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.quant_checkpoint import CheckpointQuant

logger = logging.getLogger(__name__)

SKIPPED = ("input_scale",)  # static activation scales: activations stay float on the CPU


@dataclass(frozen=True)
class Fp8Layer:
    """One layer's scale layout, from the config (checked against each tensor's shape)."""

    strategy: str  # "channel", "block" or "tensor"
    block: tuple[int, int] = (0, 0)  # [bn, bk] for "block"


class CompressedTensorsMethod(CheckpointMethod):
    """The checkpoint's own method, selected by its config.json (CheckpointMethod's checks)."""

    def __init__(self):
        super().__init__("compressed-tensors")

    def _repacked(self, weights: Iterator, model: nn.Module, quant: CheckpointQuant) -> Iterator:
        layout = Fp8Layer(quant.strategy, quant.block)
        pending: dict[str, dict[str, torch.Tensor]] = {}
        count, seconds = 0, 0.0
        for name, tensor in weights:
            prefix, _, kind = name.rpartition(".")
            if kind in SKIPPED:
                continue
            if kind == "weight" and tensor.dtype != torch.float8_e4m3fn:
                yield name, self._float16(name, tensor, model)  # an ignored layer, a norm
                continue
            if kind not in ("weight", "weight_scale"):
                yield name, tensor
                continue
            parts = pending.setdefault(prefix, {})
            parts[kind] = tensor
            if len(parts) == 2:
                t0 = time.perf_counter()
                yield prefix + ".weight", self._layer(prefix, pending.pop(prefix), model, layout)
                seconds, count = seconds + time.perf_counter() - t0, count + 1
        for prefix, parts in pending.items():
            missing = "weight_scale" if "weight" in parts else "weight"
            raise ValueError(f"{prefix}: compressed-tensors FP8 checkpoint lacks its {missing}")
        logger.info(
            "kept %d FP8 matrices (%s scales) as e4m3 on the native kernels in %.2f s",
            count,
            quant.strategy,
            seconds,
        )

    def _layer(self, prefix: str, parts: dict, model, layout: Fp8Layer) -> QuantizedTensor:
        name = prefix + ".weight"
        if not model.takes_quantized(name):
            raise ValueError(f"{name}: FP8 weights for a layer the kernels do not multiply")
        q = parts["weight"]
        if q.dim() != 2:
            raise ValueError(f"{name}: FP8 weight must be 2-D, got {tuple(q.shape)}")
        rows, cols = q.shape
        if cols % FP8_BLOCK:
            raise ValueError(
                f"{name}: in_features {cols} is not a multiple of {FP8_BLOCK} (the FP8 kernel's"
                " scale block)"
            )
        return QuantizedTensor(
            fp8_rows(q, block_scales(name, parts["weight_scale"], rows, cols, layout)),
            FORMATS["fp8_e4m3"],
            cols,
        )

    def after_loading(self, model: nn.Module) -> None:
        pass


def block_scales(
    name: str, scale: torch.Tensor, rows: int, cols: int, layout: Fp8Layer
) -> torch.Tensor:
    """The checkpoint's weight_scale as one float32 per 128 input values of each row
    [rows, cols / 128]; a shape other than the strategy's is refused naming both."""
    s = scale.float()
    if layout.strategy == "tensor" and s.numel() == 1:
        return s.reshape(1, 1).expand(rows, cols // FP8_BLOCK)
    if layout.strategy == "channel" and s.shape in ((rows, 1), (rows,)):
        return s.reshape(rows, 1).expand(rows, cols // FP8_BLOCK)
    if layout.strategy == "block":
        bn, bk = layout.block
        if s.shape == (-(-rows // bn), -(-cols // bk)):
            s = s.repeat_interleave(bn, dim=0)[:rows]
            return s.repeat_interleave(bk // FP8_BLOCK, dim=1)
    raise ValueError(
        f"{name}: weight_scale {tuple(scale.shape)} does not fit the {layout.strategy} strategy"
        f" for a [{rows}, {cols}] weight"
    )


COMPRESSED_TENSORS = CompressedTensorsMethod()
