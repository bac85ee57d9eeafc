"""FP8 checkpoints, two layouts of the same thing: each quantized linear layer is `<layer>.weight`,
float8_e4m3fn [out, in], beside its scales.

- `compressed-tensors`: llm-compressor's (config.json quantization_config quant_method
  "compressed-tensors", format "float-quantized": the FP8_DYNAMIC, FP8 and FP8_BLOCK schemes).
  `<layer>.weight_scale`, float32 or 16-bit: [out, 1] per channel, [ceil(out / bn), ceil(in / bk)]
  per [bn, bk] block, or one value per tensor.
- `fp8_serialized`: quant_method "fp8" (DeepSeek-V3/R1's, Qwen3's and MiniMax's FP8 releases;
  transformers' FineGrainedFP8, SGLang's / vLLM's Fp8Config): with weight_block_size,
  `<layer>.weight_scale_inv` float32 [ceil(out / bn), ceil(in / bk)], which despite its name is
  the multiplier (w = q * scale_inv: transformers' Fp8Dequantize; its quantizer stores
  max|w| / 448); without, one scale per tensor, `weight_scale` (vLLM's and SGLang's per-tensor
  serialization) or `weight_scale_inv` (transformers').

The weights stay e4m3 on the native CPU kernel (kernels/formats.py: fp8_e4m3, a float32 scale per
128 values beside the bytes as stored), so the held model is the file's size plus 3%; the scale
each 128 values take is the checkpoint's own, so x = q * s is what HF's dequantization computes,
bit for bit. An MoE's experts (one tensor per expert in the file) are laid out the same way into
one [E, rows, bytes] stack per projection as they stream in, handed over whole where the model
takes such stacks (MoeForCausalLM.expert_stack), and the fused MoE op reads them as they are; any
other MoE's FP8 experts are refused by name.

Activations stay float32 whatever the config says (dynamic per-token or per-group and static FP8
activations are what a GPU's FP8 GEMM needs; on the CPU the weight is the one rounding), so a
static scheme's `input_scale` (`activation_scale`) tensors are read past. The layers left out
(`ignore`, `modules_to_not_convert` / `ignored_layers`: the LM head, routers) are 16-bit in the
file and stay 16-bit on the f16 / bf16 kernels: each layer's own dtype in the file decides.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.kernels.formats import FORMATS, FP8_BLOCK, fp8_rows
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.quantized import QuantizedTensor
from radixlm.model.quant import checkpoint as quant_checkpoint
from radixlm.model.quant.awq_gptq import CheckpointMethod
from radixlm.model.quant.checkpoint import CheckpointQuant, json_key, refuse

logger = logging.getLogger(__name__)

# Static activation scales (vLLM's and SGLang's name, transformers'): activations stay float here.
SKIPPED = ("input_scale", "activation_scale")


def parse_compressed_tensors(cfg: dict) -> CheckpointQuant:
    """llm-compressor's quantization_config: one FP8 weight scheme, per channel, block or tensor."""
    method = "compressed-tensors"
    fmt = str(cfg.get("format", "")).lower()
    if fmt not in ("float-quantized", "naive-quantized"):
        raise refuse(method, "format", fmt, "float-quantized: FP8 weights")
    if cfg.get("kv_cache_scheme"):
        raise refuse(method, "kv_cache_scheme", "FP8 KV scales", "none")
    if cfg.get("sparsity_config"):
        raise refuse(method, "sparsity_config", "sparse weights", "none")
    groups = cfg.get("config_groups") or {}
    schemes = {json_key(g.get("weights")) for g in groups.values()}
    if len(schemes) != 1:
        raise refuse(method, "config_groups", f"{len(schemes)} weight schemes", "one")
    w = next(iter(groups.values())).get("weights") or {}
    fp8 = (("type", "float"), ("num_bits", 8), ("symmetric", True), ("dynamic", False))
    for field, want in fp8:
        if w.get(field, want) != want:
            raise refuse(method, f"weights.{field}", w.get(field), f"{want}: FP8 e4m3 weights")
    strategy = str(w.get("strategy", "tensor")).lower()
    block = (0, 0)
    if strategy == "block":
        bn, bk = (int(v) for v in w.get("block_structure") or (0, 0))
        if bn <= 0 or bk <= 0 or bk % 128:
            raise refuse(method, "block_structure", [bn, bk], "[n, k] with k a multiple of 128")
        block = (bn, bk)
    elif strategy not in ("channel", "tensor"):
        raise refuse(method, "weights.strategy", strategy, "channel, block or tensor")
    return CheckpointQuant(method, 8, -1, False, True, 0, strategy=strategy, block=block)


def parse_fp8(cfg: dict) -> CheckpointQuant:
    """transformers' FineGrainedFP8Config, SGLang's and vLLM's Fp8Config, serialized: e4m3 weights,
    with weight_block_size a float32 `weight_scale_inv` per [bn, bk] block (the multiplier: w = q *
    scale_inv, transformers' Fp8Dequantize), without it one scale per tensor (`weight_scale`,
    vLLM's and SGLang's; transformers' `weight_scale_inv`)."""
    method = "fp8"
    fmt = str(cfg.get("fmt") or "e4m3").lower()
    if fmt != "e4m3":  # DeepSeek's config spells it; e5m2 weights have no kernel here
        raise refuse(method, "fmt", fmt, "e4m3")
    scheme = str(cfg.get("activation_scheme") or "dynamic").lower()
    if scheme not in ("dynamic", "static"):
        raise refuse(method, "activation_scheme", scheme, "dynamic or static")
    for field, supported in (
        ("kv_cache_quant_algo", "none: FP8 KV scales"),
        ("modules_to_convert", "none: FP8 embeddings"),
    ):
        if cfg.get(field):
            raise refuse(method, field, cfg[field], supported)
    if str(cfg.get("expert_dtype") or "fp8").lower() != "fp8":
        raise refuse(method, "expert_dtype", cfg["expert_dtype"], "fp8")
    if str(cfg.get("scale_fmt") or "float").lower() not in ("float", "ue8m0"):
        raise refuse(method, "scale_fmt", cfg["scale_fmt"], "float or ue8m0")
    size = cfg.get("weight_block_size")
    if size is None:
        return CheckpointQuant(
            quant_checkpoint.FP8_SERIALIZED, 8, -1, False, True, 0, strategy="tensor"
        )
    if scheme != "dynamic":  # as SGLang's Fp8Config: block scales come with dynamic activations
        raise refuse(method, "activation_scheme", scheme, "dynamic with weight_block_size")
    try:
        bn, bk = (int(v) for v in size)
    except (TypeError, ValueError):
        bn = bk = 0
    if bn <= 0 or bk <= 0 or bk % 128:
        raise refuse(method, "weight_block_size", size, "[n, k] with k a multiple of 128")
    return CheckpointQuant(
        quant_checkpoint.FP8_SERIALIZED, 8, -1, False, True, 0, strategy="block", block=(bn, bk)
    )


@dataclass(frozen=True)
class Fp8Layer:
    """One layer's scale layout, from the config (checked against each tensor's shape)."""

    strategy: str  # "channel", "block" or "tensor"
    block: tuple[int, int] = (0, 0)  # [bn, bk] for "block"


class Fp8CheckpointMethod(CheckpointMethod):
    """The checkpoint's own method, selected by its config.json (CheckpointMethod's checks).
    scales: the names a layer's weight scale takes in this layout (one per layer)."""

    def __init__(self, name: str, scales: tuple[str, ...]):
        super().__init__(name)
        self.scales = scales

    def _repacked(self, weights: Iterator, model: nn.Module, quant: CheckpointQuant) -> Iterator:
        layout = Fp8Layer(quant.strategy, quant.block)
        pending: dict[str, dict[str, torch.Tensor]] = {}
        stacks: dict[str, _ExpertStack] = {}  # an MoE's experts, until each has come in
        count, seconds = 0, 0.0
        for name, tensor in weights:
            prefix, _, kind = name.rpartition(".")
            if kind in SKIPPED:
                continue
            if kind == "weight" and tensor.dtype != torch.float8_e4m3fn:
                yield name, self._float16(name, tensor, model)  # an ignored layer, a norm
                continue
            if kind not in ("weight", *self.scales):
                yield name, tensor
                continue
            parts = pending.setdefault(prefix, {})
            if kind != "weight" and any(k != "weight" for k in parts):
                raise ValueError(f"{prefix}: two weight scales ({', '.join(self.scales)})")
            parts[kind] = tensor
            if len(parts) == 2:
                t0 = time.perf_counter()
                done = self._layer_or_stack(prefix, pending.pop(prefix), model, layout, stacks)
                seconds, count = seconds + time.perf_counter() - t0, count + 1
                if done is not None:
                    yield done
        for prefix, parts in pending.items():
            missing = " or ".join(self.scales) if "weight" in parts else "weight"
            raise ValueError(f"{prefix}: {self.name} FP8 checkpoint lacks its {missing}")
        for name, stack in stacks.items():
            raise ValueError(f"{name}: FP8 checkpoint lacks experts {stack.missing()[:8]}")
        logger.info(
            "kept %d FP8 matrices (%s scales) as e4m3 on the native kernels in %.2f s",
            count,
            quant.strategy,
            seconds,
        )

    def _layer_or_stack(
        self, prefix: str, parts: dict, model, layout: Fp8Layer, stacks: dict
    ) -> tuple[str, QuantizedTensor | ExpertWeights] | None:
        """A layer's matrix; or one expert's, kept until its projection's stack of all experts is
        whole (the fused MoE kernel reads fp8_e4m3 experts as they are), then the stack."""
        name = prefix + ".weight"
        expert = model.expert_stack(name)
        if expert is None:
            if ".experts." in name and not model.takes_quantized(name):
                raise ValueError(
                    f"{name}: FP8 experts are not supported for {type(model).__name__} (its MoE"
                    " layers take float or GGUF experts)"
                )
            if not model.takes_quantized(name):
                raise ValueError(f"{name}: FP8 weights for a layer the kernels do not multiply")
            return name, self._layer(name, parts, layout)
        stack_name, e, count = expert
        matrix = self._layer(name, parts, layout)
        stack = stacks.setdefault(stack_name, _ExpertStack(count, *matrix.shape))
        return (
            (stack_name, stacks.pop(stack_name).weights()) if stack.put(e, matrix, name) else None
        )

    def _layer(self, name: str, parts: dict, layout: Fp8Layer) -> QuantizedTensor:
        q = parts["weight"]
        if q.dim() != 2:
            raise ValueError(f"{name}: FP8 weight must be 2-D, got {tuple(q.shape)}")
        rows, cols = q.shape
        (scale_name,) = (k for k in parts if k != "weight")
        if cols % FP8_BLOCK:
            raise ValueError(
                f"{name}: in_features {cols} is not a multiple of {FP8_BLOCK} (the FP8 kernel's"
                " scale block)"
            )
        return QuantizedTensor(
            fp8_rows(q, block_scales(name, scale_name, parts[scale_name], rows, cols, layout)),
            FORMATS["fp8_e4m3"],
            cols,
        )

    def after_loading(self, model: nn.Module) -> None:
        pass


class _ExpertStack:
    """All experts' fp8_e4m3 rows of one projection, filled expert by expert: [E, rows, bytes]."""

    def __init__(self, count: int, rows: int, cols: int):
        self.fmt = FORMATS["fp8_e4m3"]
        self.rows, self.cols = rows, cols
        self.data = torch.empty(count, rows, self.fmt.row_bytes(cols), dtype=torch.uint8)
        self.filled = torch.zeros(count, dtype=torch.bool)

    def put(self, e: int, matrix: QuantizedTensor, name: str) -> bool:
        """Expert e's matrix in; True once every expert's is."""
        if matrix.shape != (self.rows, self.cols):
            raise ValueError(
                f"{name}: {list(matrix.shape)}, other experts [{self.rows}, {self.cols}]"
            )
        self.data[e] = matrix.data
        self.filled[e] = True
        return bool(self.filled.all())

    def missing(self) -> list[int]:
        return (~self.filled).nonzero().flatten().tolist()

    def weights(self) -> ExpertWeights:
        return ExpertWeights(self.data, self.fmt, self.rows, self.cols)


def block_scales(
    name: str, scale_name: str, scale: torch.Tensor, rows: int, cols: int, layout: Fp8Layer
) -> torch.Tensor:
    """The checkpoint's weight scale (`scale_name`) as one float32 per 128 input values of each row
    [rows, cols / 128]; a shape other than the strategy's is refused naming both."""
    # UE8M0 scales saved as bytes (transformers' scale_fmt ue8m0) are exponents: 2^(b - 127).
    s = (scale.float() - 127.0).exp2() if scale.dtype == torch.uint8 else scale.float()
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
        f"{name}: {scale_name} {tuple(scale.shape)} does not fit the {layout.strategy} strategy"
        f" for a [{rows}, {cols}] weight"
    )


COMPRESSED_TENSORS = Fp8CheckpointMethod("compressed-tensors", ("weight_scale",))
FP8_SERIALIZED = Fp8CheckpointMethod(
    quant_checkpoint.FP8_SERIALIZED, ("weight_scale_inv", "weight_scale")
)
