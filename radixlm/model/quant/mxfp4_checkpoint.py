"""`mxfp4`: gpt-oss's released HF checkpoints (config.json quantization_config quant_method "mxfp4",
OpenAI's release as transformers reads it). Each expert projection is stored as `<name>_blocks`,
uint8 [E, rows, cols / 32, 16] (two e2m1 values a byte, the lower-indexed one in the low nibble),
and `<name>_scales`, uint8 [E, rows, cols / 32] (e8m0 exponents, 2^(s - 127)). They are repacked at
load into GGML's MXFP4 blocks (the exponent byte, then value j in the low and j + 16 in the high
nibble of byte j; the same exponent byte: ggml's 2^(e - 128) scales doubled e2m1 values) as
ExpertWeights, the same values bit for bit, which the native MXFP4 kernel runs (gpt_oss_moe.py). The
rest of such a checkpoint is 16-bit (attention, router, embeddings, LM head): its matrices stay
16-bit on the f16 / bf16 kernels, norms and biases load as float.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import torch
from torch import nn

from radixlm.kernels.formats import FORMATS
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.quant.awq_gptq import CheckpointMethod
from radixlm.model.quant.checkpoint import CheckpointQuant

logger = logging.getLogger(__name__)

PARTS = ("blocks", "scales")


def to_ggml_blocks(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """HF's blocks [..., G, 16] and scales [..., G] -> GGML MXFP4 rows [..., G * 17]."""
    lo, hi = blocks & 0x0F, blocks >> 4
    values = torch.stack((lo, hi), dim=-1).flatten(-2)  # [..., G, 32] in order
    qs = values[..., :16] | (values[..., 16:] << 4)
    return torch.cat((scales.unsqueeze(-1), qs), dim=-1).flatten(-2).contiguous()


def parse_mxfp4(cfg: dict) -> CheckpointQuant:
    """e2m1 values with an e8m0 exponent per 32: nothing in the config to choose."""
    return CheckpointQuant("mxfp4", 4, 32, desc_act=False, sym=True, zero_offset=0)


class Mxfp4Method(CheckpointMethod):
    """The checkpoint's own method, selected by its config.json (CheckpointMethod's checks): the
    experts' MXFP4 blocks kept, on the native kernels (refused where they cannot run)."""

    def __init__(self):
        super().__init__("mxfp4")

    def _repacked(self, weights: Iterator, model: nn.Module, quant: CheckpointQuant) -> Iterator:
        pending: dict[str, dict[str, torch.Tensor]] = {}
        count, seconds = 0, 0.0
        for name, tensor in weights:
            prefix, _, kind = name.rpartition("_")
            if kind not in PARTS:
                yield name, self._float16(name, tensor, model)
                continue
            parts = pending.setdefault(prefix, {})
            parts[kind] = tensor
            if len(parts) == len(PARTS):
                t0 = time.perf_counter()
                yield prefix, _experts(prefix, pending.pop(prefix))
                seconds, count = seconds + time.perf_counter() - t0, count + 1
        if pending:
            raise ValueError(
                f"mxfp4 checkpoint: {sorted(pending)[0]} lacks its"
                f" {'scales' if 'blocks' in next(iter(pending.values())) else 'blocks'}"
            )
        logger.info("repacked %d MXFP4 expert projections to GGML blocks in %.2f s", count, seconds)

    def after_loading(self, model: nn.Module) -> None:
        pass


def _experts(name: str, parts: dict[str, torch.Tensor]) -> ExpertWeights:
    blocks, scales = parts["blocks"], parts["scales"]
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[-1] != 16:
        raise ValueError(
            f"{name}: MXFP4 blocks must be uint8 [..., 16] and scales uint8, got"
            f" {blocks.dtype} {tuple(blocks.shape)} and {scales.dtype}"
        )
    if blocks.dim() != 4 or blocks.shape[:-1] != scales.shape:
        raise ValueError(
            f"{name}: MXFP4 blocks [experts, rows, groups, 16] and scales [experts, rows, groups]"
            f" expected, got {tuple(blocks.shape)} and {tuple(scales.shape)}"
        )
    E, rows, groups, _ = blocks.shape
    return ExpertWeights(to_ggml_blocks(blocks, scales), FORMATS["mxfp4"], rows, 32 * groups)


MXFP4 = Mxfp4Method()
