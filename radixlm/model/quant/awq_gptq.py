"""`awq` and `gptq`: pre-quantized HF checkpoints (their quantization_config parsed here, registered
in quant/checkpoint.py) run on the native CPU kernels, each linear layer's packed tensors (qweight,
qzeros, scales, g_idx) repacked into GGUF blocks as they stream in (quant/awq_gptq_repack.py):
never widened to float.

The loader sees `<layer>.weight` as a QuantizedTensor, as from a GGUF, so fused layers stack their
shards' blocks as usual. Act-order layers also get their input permutation once loaded
(layers/permuted_matrix.py); the shards of one fused layer share their input, so they must share
the permutation. The 16-bit matrices the checkpoint keeps (embeddings, the LM head as a rule) stay
16-bit on the f16 / bf16 kernels; norms and biases load as float.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator

import torch
from torch import nn

from radixlm.model.quant.awq_gptq_repack import default_g_idx, repack, unpack_awq, unpack_gptq
from radixlm.model.quant.checkpoint import CheckpointQuant, checkpoint_quant, group_size, refuse
from radixlm.model.quant.methods import QuantMethod, native_unavailable_reason
from radixlm.model.traits import tp_sharded

logger = logging.getLogger(__name__)

PACKED = ("qweight", "qzeros", "scales", "g_idx")
_NEEDED = frozenset(PACKED[:3])


def parse_awq(cfg: dict) -> CheckpointQuant:
    """AutoAWQ's quantization_config: the GEMM layout, 4 bits with zero points."""
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise refuse("awq", "version", version, "gemm")
    bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
    if bits != 4:
        raise refuse("awq", "bits", bits, "4")
    if not cfg.get("zero_point", True):
        raise refuse("awq", "zero_point", False, "true")
    group = group_size("awq", cfg.get("group_size", cfg.get("q_group_size", 128)))
    return CheckpointQuant("awq", bits, group, desc_act=False, sym=False, zero_offset=0)


def parse_gptq(cfg: dict) -> CheckpointQuant:
    """AutoGPTQ's / GPTQModel's quantization_config: 4 or 8 bits, v1 or v2 zeros, act-order."""
    bits = int(cfg.get("bits", 4))
    if bits not in (4, 8):
        raise refuse("gptq", "bits", bits, "4 or 8")
    fmt = str(cfg.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise refuse("gptq", "checkpoint_format", fmt, "gptq or gptq_v2")
    if cfg.get("is_marlin_format"):
        raise refuse("gptq", "is_marlin_format", True, "false")
    if cfg.get("dynamic"):  # GPTQModel's per-module overrides (bits, group size per layer)
        raise refuse("gptq", "dynamic", "per-module overrides", "none")
    sym = bool(cfg.get("sym", True))
    if bits == 8 and not sym:  # (q - z) spans 9 bits: no int8 block format holds it
        raise refuse("gptq", "sym", False, "true with bits 8")
    return CheckpointQuant(
        "gptq",
        bits,
        group_size("gptq", cfg.get("group_size", 128)),
        desc_act=bool(cfg.get("desc_act", False)),
        sym=sym,
        zero_offset=1 if fmt == "gptq" else 0,
    )


class CheckpointMethod(QuantMethod):
    """A pre-quantized checkpoint's own method (`awq`, `gptq`), selected by its config.json."""

    # Refused where the native kernels cannot run: widening the weights to float is not offered.
    refused_elsewhere = True
    float16_kv = True

    def __init__(self, name: str):
        self.name = name
        # Per model being loaded: each act-order layer's input permutation, until after_loading.
        self._perms: weakref.WeakKeyDictionary[nn.Module, torch.Tensor | None] = (
            weakref.WeakKeyDictionary()
        )

    def unavailable_reason(self, device: torch.device) -> str | None:
        return native_unavailable_reason(device)

    def while_loading(self, weights, model):
        quant = checkpoint_quant(model.config)
        if quant is None or quant.method != self.name:
            raise ValueError(f"--quantization {self.name}: the checkpoint is not {self.name}")
        if not model.traits().loads_quantized_weights:
            raise ValueError(f"{type(model).__name__} does not take {self.name} weights")
        if tp_sharded(model):
            raise ValueError(f"{self.name} checkpoints are not supported with tensor parallelism")
        return self._repacked(weights, model, quant)

    def _repacked(
        self, weights: Iterator, model: nn.Module, quant: CheckpointQuant
    ) -> Iterator[tuple[str, torch.Tensor]]:
        # A layer's tensors are adjacent in a file (safetensors sorts its keys: g_idx, qweight,
        # qzeros, scales); a layer is repacked once its last one is in, so one is held at a time.
        pending: dict[str, dict[str, torch.Tensor]] = {}
        done: set[str] = set()
        count, seconds = 0, 0.0
        for name, tensor in weights:
            prefix, _, kind = name.rpartition(".")
            if kind not in PACKED:
                yield name, self._float16(name, tensor, model)
                continue
            if prefix in done:  # a g_idx after its layer: only the plain order is implied
                self._check_late_g_idx(name, tensor, quant)
                continue
            parts = pending.setdefault(prefix, {})
            parts[kind] = tensor
            if _NEEDED <= parts.keys() and ("g_idx" in parts or not quant.desc_act):
                t0 = time.perf_counter()
                repacked = self._layer(prefix, pending.pop(prefix), model, quant)
                seconds, count = seconds + time.perf_counter() - t0, count + 1
                done.add(prefix)
                yield prefix + ".weight", repacked
        for prefix, parts in pending.items():
            missing = sorted(_NEEDED - parts.keys())
            if missing:
                raise ValueError(f"{prefix}: {self.name} checkpoint lacks {', '.join(missing)}")
            yield prefix + ".weight", self._layer(prefix, parts, model, quant)
            count += 1
        logger.info(
            "repacked %d %s matrices (%d-bit, group %d) to the native formats in %.2f s",
            count,
            self.name,
            quant.bits,
            quant.group_size,
            seconds,
        )

    @staticmethod
    def _float16(name: str, tensor: torch.Tensor, model) -> torch.Tensor:
        """A 16-bit matrix the kernels multiply by (embeddings, the LM head) kept 16-bit on the
        f16 / bf16 kernels, exactly: as float32 it would double the checkpoint's largest tensors."""
        from radixlm.model.layers.quantized import QuantizedTensor

        fmt = {torch.float16: "f16", torch.bfloat16: "bf16"}.get(tensor.dtype)
        if fmt is None or tensor.dim() != 2 or not model.takes_quantized(name):
            return tensor
        return QuantizedTensor.quantize(tensor, fmt)

    def _layer(self, prefix: str, parts: dict, model, quant: CheckpointQuant):
        name = prefix + ".weight"
        if not model.takes_quantized(name):
            raise ValueError(f"{name}: {self.name} weights for a layer the kernels do not multiply")
        if quant.method == "awq":
            q, z = unpack_awq(parts["qweight"], parts["qzeros"])
        else:
            q, z = unpack_gptq(parts["qweight"], parts["qzeros"], quant.bits, quant.zero_offset)
        g_idx = parts.get("g_idx")
        if g_idx is None:
            g_idx = default_g_idx(q.shape[1], quant.group_size)
        tensor, perm = repack(q, z, parts["scales"], g_idx, quant.bits, name)
        self._keep_perm(model, name, perm)
        return tensor

    def _keep_perm(self, model, name: str, perm: torch.Tensor | None) -> None:
        """Records the layer's input permutation (None: none) on the module that takes it; the
        shards of a fused layer must agree."""
        owner = model.module_of(name)
        if owner is None:
            if perm is not None:
                raise ValueError(f"{name}: act-order (desc_act) is not supported for this layer")
            return
        if owner in self._perms:
            kept = self._perms[owner]
            if (kept is None) != (perm is None) or (
                perm is not None and not torch.equal(kept, perm)
            ):
                raise ValueError(f"{name}: act-order shards of one fused layer differ in g_idx")
        self._perms[owner] = perm

    @staticmethod
    def _check_late_g_idx(name: str, g_idx: torch.Tensor, quant: CheckpointQuant) -> None:
        if not torch.equal(g_idx.to(torch.int64), default_g_idx(len(g_idx), quant.group_size)):
            raise ValueError(f"{name}: act-order g_idx but the config says desc_act false")

    def after_loading(self, model: nn.Module) -> None:
        from radixlm.model.layers.permuted_matrix import PermutedInputMatrix

        for module in model.modules():
            perm = self._perms.pop(module, None)
            if perm is not None:
                module.set_matrix(PermutedInputMatrix(module.qweight, perm))


AWQ = CheckpointMethod("awq")
GPTQ = CheckpointMethod("gptq")
