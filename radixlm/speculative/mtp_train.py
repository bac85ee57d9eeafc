"""A fitted multi-token-prediction head's tensors (`radixlm train-eagle --mtp`, eagle_train.py)
under the checkpoint's names, and putting them into a HF checkpoint directory."""

from __future__ import annotations

import glob
import os

import torch

from radixlm.speculative.mtp_head import MtpHead

FIT_NAMES = ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")


def fitted_tensors(head: MtpHead) -> dict[str, torch.Tensor]:
    """The fit_parameters (float32) under the checkpoint's names: `model.layers.{index}.*`, or
    the family's `mtp.*` (Qwen3.5 / Qwen3-Next, Nemotron-3: their first head's)."""
    from radixlm.speculative.mtp_checkpoint import MTP_FAMILY_REGISTRY

    family = MTP_FAMILY_REGISTRY.meta(head.cfg.architecture)
    prefix = f"model.layers.{head.cfg.layer_index}."
    named = lambda name: family.to_mtp(name, head.layer) if family.mtp_names else prefix + name
    return {
        named(name): p.detach().float().contiguous().cpu()
        for name, p in zip(FIT_NAMES, head.fit_parameters())
    }


def save_mtp_fit(head: MtpHead, file: str) -> None:
    from safetensors.torch import save_file

    tmp = file + ".tmp"
    save_file(fitted_tensors(head), tmp)
    os.replace(tmp, file)


def install_mtp_fit(fit_file: str, model_dir: str) -> None:
    """Overwrite the head's tensors in the directory's safetensors shard that holds them."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    fit = load_file(fit_file)
    for file in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(file, framework="pt") as f:
            if not set(fit) <= set(f.keys()):
                continue
        tensors = load_file(file)
        tensors.update(fit)
        save_file(tensors, file, metadata={"format": "pt"})
        return
    raise ValueError(f"{model_dir!r}: no safetensors file holds {sorted(fit)[0]!r}")
