"""A peft LoRA adapter read from its directory (adapter_config.json + adapter_model.safetensors) and
checked.

peft's layout: per target projection `lora_A.weight` [r, in] and `lora_B.weight` [out, r]; the
delta is scale * x A^T B^T with scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).
The scale is folded into B here, once. What the batched compute cannot reproduce is refused at
load with its peft name: DoRA (use_dora), biases (bias, lora_bias), modules_to_save, per-module
ranks (rank_pattern, alpha_pattern), fan_in_fan_out, and any tensor that is not lora_A / lora_B.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field

import torch

from radixlm.lora.config import TARGET_MODULES, LoRARef

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."  # peft's wrapper around the HF model


class AdapterError(ValueError):
    """An adapter that cannot be served (the message names the file, field or tensor)."""


@dataclass(frozen=True)
class AdapterConfig:
    r: int
    lora_alpha: float
    use_rslora: bool

    @property
    def scale(self) -> float:
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @classmethod
    def read(cls, path: str) -> AdapterConfig:
        file = os.path.join(path, CONFIG_FILE)
        try:
            with open(file) as f:
                cfg = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise AdapterError(f"{file}: cannot read a peft adapter config ({e})") from None
        if not isinstance(cfg, dict):
            raise AdapterError(f"{file}: not a JSON object")
        refused = [
            (k, why)
            for k, why in (
                ("use_dora", "DoRA"),
                ("lora_bias", "LoRA biases"),
                ("fan_in_fan_out", "fan_in_fan_out layers"),
            )
            if cfg.get(k)
        ]
        refused += [
            (k, k) for k in ("modules_to_save", "rank_pattern", "alpha_pattern") if cfg.get(k)
        ]
        if cfg.get("bias", "none") != "none":
            refused.append(("bias", f"bias={cfg['bias']!r}"))
        if cfg.get("peft_type", "LORA") != "LORA":
            refused.append(("peft_type", f"peft_type {cfg.get('peft_type')!r}"))
        if refused:
            raise AdapterError(
                f"{file}: not supported: {', '.join(why for _, why in refused)} "
                f"({', '.join(k for k, _ in refused)}); plain LoRA adapters only"
            )
        r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
        if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)):
            raise AdapterError(f"{file}: r must be a positive integer and lora_alpha a number")
        # The targets are read from the tensors (peft writes target_modules as names, paths or a
        # regex).
        return cls(r, float(alpha), bool(cfg.get("use_rslora", False)))


@dataclass
class LoRAAdapter:
    """One loaded adapter. weights: HF module path (model.layers.0.self_attn.q_proj) -> (A [r, in],
    scale * B [out, r]), in the model's dtype."""

    ref: LoRARef
    # NAME@digest of its files: its prefix-cache namespace (the storage tier's keys outlive the
    # process), so a name reloaded with other weights shares no KV, and the same files keep theirs.
    uid: str
    config: AdapterConfig
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.config.r

    @property
    def targets(self) -> frozenset[str]:
        return frozenset(p.rsplit(".", 1)[-1] for p in self.weights)


def load_adapter(ref: LoRARef, dtype: torch.dtype) -> LoRAAdapter:
    from safetensors import SafetensorError
    from safetensors.torch import load

    cfg = AdapterConfig.read(ref.lora_path)
    file = os.path.join(ref.lora_path, WEIGHTS_FILE)
    try:
        with open(file, "rb") as f:
            data = f.read()
        with open(os.path.join(ref.lora_path, CONFIG_FILE), "rb") as f:
            digest = hashlib.sha256(f.read() + data).hexdigest()[:16]
        tensors = load(data)
    except (OSError, SafetensorError) as e:
        raise AdapterError(f"{file}: cannot read the adapter weights ({e})") from None
    uid = f"{ref.lora_name}@{digest}"
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        module, dot, kind = key.removeprefix(_PREFIX).rpartition(".lora_")
        if not dot or kind not in ("A.weight", "B.weight"):
            raise AdapterError(
                f"{file}: tensor {key!r} is not a lora_A / lora_B weight (biases, DoRA magnitudes, "
                "embeddings and modules_to_save are not supported)"
            )
        module = module.removesuffix(".default")
        if module.rsplit(".", 1)[-1] not in TARGET_MODULES:
            raise AdapterError(
                f"{file}: tensor {key!r} targets a module outside {', '.join(TARGET_MODULES)}"
            )
        pairs.setdefault(module, {})[kind[0]] = t
    adapter = LoRAAdapter(ref, uid, cfg)
    for module, ab in pairs.items():
        a, b = ab.get("A"), ab.get("B")
        if (
            a is None
            or b is None
            or a.dim() != 2
            or b.dim() != 2
            or a.shape[0] != cfg.r
            or b.shape[1] != cfg.r
        ):
            raise AdapterError(
                f"{file}: {module} needs lora_A [r={cfg.r}, in] and lora_B [out, r={cfg.r}], got"
                f" {None if a is None else tuple(a.shape)} and"
                f" {None if b is None else tuple(b.shape)}"
            )
        adapter.weights[module] = (
            a.to(dtype).contiguous(),
            (b.double() * cfg.scale).to(dtype).contiguous(),
        )
    if not adapter.weights:
        raise AdapterError(f"{file}: no lora_A / lora_B tensors")
    return adapter
