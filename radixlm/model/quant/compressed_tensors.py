"""llm-compressor's checkpoints (quant_method "compressed-tensors"): FP8 weights (format
float-quantized) load in quant/fp8_checkpoint.py; the integer formats load here, repacked into the
native CPU kernels' blocks as they stream in, as AWQ / GPTQ are (quant/awq_gptq_repack.py):

- `pack-quantized` (W4A16, W8A16: the `*-quantized.w4a16` releases): `<layer>.weight_packed` int32
  [out, in * bits / 32], 32 / bits values per int32, value j at bit bits*j, each stored as
  q + 2^(bits-1) (compressed-tensors' pack_to_int32, whose dense packing is exactly this for 4 and 8
  bits); `weight_shape` [out, in]; `weight_scale` [out, groups] ([out, 1] per channel);
  asymmetric: `weight_zero_point` packed the same way along the output, [out * bits / 32, groups].
- `int-quantized` (W8A8) and `naive-quantized` integer weights: `<layer>.weight` int8 [out, in]
  as q itself, `weight_scale` as above, `weight_zero_point` int8 [out, groups] when asymmetric.

Either way w = (q - z) * s, z 0 when symmetric; with the codes offset by 2^(bits-1), the GPTQ
repack's (q - z) * s over unsigned codes: 4-bit symmetric -> Q4_0 and 8-bit symmetric -> Q8_0,
both exact (a bf16 scale is exact in f16; a float32 one rounds to f16, GPTQ's own scale width);
4-bit with zero points -> Q4_1 (m = -s*z rounded to f16, its one inexact step). 8-bit with zero
points ((q - z) spans 9 bits) has no block format and is refused. A `weight_g_idx` (GPTQ act-order,
actorder "group") permutes the input as GPTQ's does.

Activations stay float32 whatever the config says: W8A8's dynamic per-token int8 activations are
for a GPU's int8 GEMM; here the weights are the model's one rounding (the kernels' own int8 rows
for the dots aside), and a static scheme's `input_scale` / `input_zero_point` are read past.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import nn

from radixlm.model.quant import fp8_checkpoint
from radixlm.model.quant.awq_gptq import CheckpointMethod
from radixlm.model.quant.awq_gptq_repack import default_g_idx, repack, unpack_int32
from radixlm.model.quant.checkpoint import CheckpointQuant, group_size, json_key, refuse

logger = logging.getLogger(__name__)

METHOD = "compressed-tensors"
FLOAT, PACKED, INT = "float-quantized", "pack-quantized", "int-quantized"
NAIVE = "naive-quantized"  # either type's plain tensors: the weights' type decides
# Static activation qparams (int8 W8A8's static scheme), read past: activations stay float32.
SKIPPED = ("input_scale", "input_zero_point", "output_scale", "output_zero_point")
KINDS = ("weight", "weight_packed", "weight_shape", "weight_scale", "weight_zero_point")
G_IDX = "weight_g_idx"


def parse_compressed_tensors(cfg: dict) -> CheckpointQuant:
    """The quantization_config: FP8 (fp8_checkpoint's parser) or one integer weight scheme."""
    fmt = str(cfg.get("format", "")).lower()
    groups = cfg.get("config_groups") or {}
    if fmt == "mixed-precision":  # the groups' own formats, when they are one
        inner = {str(g.get("format") or "").lower() for g in groups.values()}
        fmt = inner.pop() if len(inner) == 1 else fmt
    weights = [g.get("weights") or {} for g in groups.values()]
    float_weights = bool(weights) and str(weights[0].get("type", "int")).lower() == "float"
    if fmt == FLOAT or (fmt == NAIVE and float_weights):
        return replace(fp8_checkpoint.parse_compressed_tensors(dict(cfg, format=fmt)), fmt=FLOAT)
    if fmt not in (PACKED, INT, NAIVE):
        raise refuse(METHOD, "format", fmt, f"{FLOAT}, {PACKED}, {INT}")
    for field, what in (
        ("kv_cache_scheme", "quantized KV scales"),
        ("sparsity_config", "sparse weights"),
        ("transform_config", "rotations"),
    ):
        if cfg.get(field):
            raise refuse(METHOD, field, what, "none")
    if len({json_key(w) for w in weights}) != 1:
        raise refuse(METHOD, "config_groups", f"{len(set(map(json_key, weights)))} schemes", "one")
    return _int_scheme(weights[0], fmt)


def _int_scheme(w: dict, fmt: str) -> CheckpointQuant:
    kind = str(w.get("type", "int")).lower()
    if kind != "int":
        raise refuse(METHOD, "weights.type", kind, f"int with format {fmt}")
    bits = int(w.get("num_bits", 8))
    if bits not in (4, 8):
        raise refuse(METHOD, "weights.num_bits", bits, "4 or 8")
    if w.get("dynamic"):
        raise refuse(METHOD, "weights.dynamic", w["dynamic"], "false")
    strategy = str(w.get("strategy", "tensor")).lower()
    if strategy not in ("group", "channel", "tensor"):
        raise refuse(METHOD, "weights.strategy", strategy, "group, channel or tensor")
    sym = bool(w.get("symmetric", True))
    if not sym and bits == 8:  # (q - z) spans 9 bits: no int8 block format holds it
        raise refuse(METHOD, "weights.symmetric", False, "true with num_bits 8")
    if not sym and strategy == "tensor":
        raise refuse(METHOD, "weights.symmetric", False, "true with strategy tensor")
    if w.get("scale_dtype") or w.get("zp_dtype"):  # MX / FP4-style scales: not integer schemes'
        field = "scale_dtype" if w.get("scale_dtype") else "zp_dtype"
        raise refuse(METHOD, f"weights.{field}", w[field], "none")
    actorder = str(w.get("actorder") or "none").lower()
    # compressed-tensors' aliases: dynamic and true are group, static is weight.
    if actorder not in ("none", "false", "true", "group", "dynamic", "weight", "static"):
        raise refuse(METHOD, "weights.actorder", actorder, "group, weight or none")
    group = group_size(METHOD, w.get("group_size")) if strategy == "group" else -1
    return CheckpointQuant(
        METHOD,
        bits,
        group,
        desc_act=actorder in ("group", "dynamic", "true"),  # a weight_g_idx per layer
        sym=sym,
        zero_offset=0,
        strategy=strategy,
        fmt=fmt,
    )


class CompressedTensorsMethod(CheckpointMethod):
    """`compressed-tensors`: FP8 weights kept e4m3 (fp8_checkpoint), integer ones repacked."""

    def __init__(self):
        super().__init__(METHOD)
        self._fp8 = fp8_checkpoint.COMPRESSED_TENSORS

    def _repacked(self, weights: Iterator, model: nn.Module, quant: CheckpointQuant) -> Iterator:
        if quant.fmt == FLOAT:
            return self._fp8._repacked(weights, model, quant)
        return self._int_repacked(weights, model, quant)

    def _needed(self, quant: CheckpointQuant) -> frozenset[str]:
        needed = {"weight_scale"} | (
            {"weight_packed", "weight_shape"} if quant.fmt == PACKED else {"weight"}
        )
        needed |= set() if quant.sym else {"weight_zero_point"}
        return frozenset(needed | ({G_IDX} if quant.desc_act else set()))

    def _int_repacked(self, weights: Iterator, model: nn.Module, quant: CheckpointQuant):
        # A layer's tensors are adjacent (safetensors sorts its keys): each is repacked once its
        # last one is in, so one layer is held at a time.
        needed, pending = self._needed(quant), {}
        count, seconds = 0, 0.0
        for name, tensor in weights:
            prefix, _, kind = name.rpartition(".")
            if kind in SKIPPED:
                continue
            if kind == "weight" and tensor.is_floating_point():
                yield name, self._float16(name, tensor, model)  # an ignored layer, a norm
                continue
            if kind not in (*KINDS, G_IDX):
                yield name, tensor
                continue
            parts = pending.setdefault(prefix, {})
            parts[kind] = tensor
            if needed <= parts.keys():
                t0 = time.perf_counter()
                repacked = self._int_layer(prefix, pending.pop(prefix), model, quant)
                seconds, count = seconds + time.perf_counter() - t0, count + 1
                yield prefix + ".weight", repacked
        for prefix, parts in pending.items():
            missing = ", ".join(sorted(needed - parts.keys()))
            raise ValueError(f"{prefix}: {quant.fmt} checkpoint lacks {missing}")
        logger.info(
            "repacked %d %s matrices (%d-bit, %s) to the native formats in %.2f s",
            count,
            quant.fmt,
            quant.bits,
            f"group {quant.group_size}" if quant.group_size > 0 else quant.strategy,
            seconds,
        )

    def _int_layer(self, prefix: str, parts: dict, model, quant: CheckpointQuant):
        name = prefix + ".weight"
        if not model.takes_quantized(name):
            raise ValueError(f"{name}: {quant.fmt} weights for a layer the kernels do not multiply")
        q = unpack_codes(name, parts, quant)
        rows, cols = q.shape
        scale = parts["weight_scale"]
        groups = 1 if quant.group_size == -1 else -(-cols // quant.group_size)
        if quant.strategy == "tensor" and scale.numel() == 1:
            scale = scale.reshape(1, 1).expand(rows, 1)
        if tuple(scale.shape) != (rows, groups):
            raise ValueError(
                f"{name}: weight_scale {tuple(scale.shape)} does not fit the {quant.strategy}"
                f" strategy for a [{rows}, {cols}] weight (expected ({rows}, {groups}))"
            )
        z = unpack_zeros(name, parts.get("weight_zero_point"), quant, rows, groups)
        g_idx = parts.get(G_IDX)
        if g_idx is None:
            g_idx = default_g_idx(cols, quant.group_size)
        tensor, perm = repack(q, z, scale.T, g_idx, quant.bits, name)
        self._keep_perm(model, name, perm)
        return tensor

    def after_loading(self, model: nn.Module) -> None:
        super().after_loading(model)  # act-order layers' input permutations (FP8: none)


def unpack_codes(name: str, parts: dict, quant: CheckpointQuant) -> torch.Tensor:
    """The layer's codes q + 2^(bits-1), uint8 [out, in]."""
    offset = 1 << (quant.bits - 1)
    if quant.fmt != PACKED:
        w = parts["weight"]
        if w.dtype != torch.int8 or w.dim() != 2:
            raise ValueError(f"{name}: {quant.fmt} weight must be 2-D int8, got {w.dtype}")
        if quant.bits == 4 and (int(w.min()) < -8 or int(w.max()) > 7):
            raise ValueError(f"{name}: 4-bit weight values outside [-8, 7]")
        return (w.to(torch.int16) + offset).to(torch.uint8)
    packed, shape = parts["weight_packed"], parts["weight_shape"].tolist()
    if packed.dtype != torch.int32 or packed.dim() != 2 or len(shape) != 2:
        raise ValueError(f"{name}: weight_packed must be 2-D int32 beside a 2-D weight_shape")
    rows, cols = (int(v) for v in shape)
    if packed.shape[0] != rows or packed.shape[1] * (32 // quant.bits) < cols:
        raise ValueError(
            f"{name}: weight_packed {tuple(packed.shape)} does not hold weight_shape {shape}"
        )
    return unpack_int32(packed, quant.bits).reshape(rows, -1)[:, :cols].contiguous()


def unpack_zeros(
    name: str, zp: torch.Tensor | None, quant: CheckpointQuant, rows: int, groups: int
) -> torch.Tensor:
    """Each group's zero as a code, int32 [groups, out] (the codes' offset when symmetric)."""
    offset = 1 << (quant.bits - 1)
    if quant.sym:
        return torch.full((groups, rows), offset, dtype=torch.int32)
    if quant.fmt == PACKED:  # [out * bits / 32, groups], packed along the output
        if zp.dtype != torch.int32 or zp.dim() != 2 or zp.shape[1] != groups:
            raise ValueError(f"{name}: weight_zero_point {tuple(zp.shape)} is not packed zeros")
        z = unpack_int32(zp.T.contiguous(), quant.bits).reshape(groups, -1)
        if z.shape[1] < rows:
            raise ValueError(f"{name}: weight_zero_point holds {z.shape[1]} rows, not {rows}")
        return z[:, :rows].to(torch.int32)
    if tuple(zp.shape) != (rows, groups):
        raise ValueError(f"{name}: weight_zero_point {tuple(zp.shape)}, expected {(rows, groups)}")
    return zp.T.to(torch.int32) + offset


COMPRESSED_TENSORS = CompressedTensorsMethod()
