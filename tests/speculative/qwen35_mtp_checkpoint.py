"""A tiny Qwen3.5 (or Qwen3.5-MoE, Qwen3-Next: the same block, its layer's MLP a mixture of
experts) checkpoint with an `mtp.*` block (mtp.fc, mtp.pre_fc_norm_embedding / _hidden,
mtp.layers.0.* a full-attention layer of the family, mtp.norm) the way the published checkpoints
carry it: in the safetensors beside the model's, announced by `mtp_num_hidden_layers`; and the GGUF
llama.cpp's converter writes of it with the block kept (mtp_gguf)."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from tests.model.hybrid_checkpoints import RESIDUAL_WRITERS, hybrid_checkpoint, write_gguf


def mtp_tensors(hf, g: torch.Generator) -> dict[str, torch.Tensor]:
    """An MTP block: a full-attention layer's shapes (drawn afresh), the fusion and its norms."""
    cfg = hf.config
    full = cfg.layer_types.index("full_attention")
    h = cfg.hidden_size
    out = {
        "mtp.fc.weight": torch.randn(h, 2 * h, generator=g) * (2 * h) ** -0.5,
        "mtp.pre_fc_norm_embedding.weight": 0.2 * torch.randn(h, generator=g),
        "mtp.pre_fc_norm_hidden.weight": 0.2 * torch.randn(h, generator=g),
        "mtp.norm.weight": 0.2 * torch.randn(h, generator=g),
    }
    for name, t in hf.state_dict().items():
        if name.startswith(f"model.layers.{full}."):
            rest = name.removeprefix(f"model.layers.{full}.")
            scale = 0.2 if "norm" in rest else t.shape[-1] ** -0.5
            out[f"mtp.layers.0.{rest}"] = torch.randn(t.shape, generator=g) * scale
    return out


def qwen35_mtp_checkpoint(
    path: str,
    tokenizer=None,
    seed: int = 5,
    transparent: bool = False,
    arch: str = "qwen35",
    **changes,
):
    """(path, hf model, the MTP tensors): the model of `arch` (hybrid_checkpoints.ARCHITECTURES:
    qwen35, qwen35moe, qwen3next) saved by hybrid_checkpoint, its MTP block in mtp.safetensors and
    mtp_num_hidden_layers = 1 in its config (not Qwen3-Next's: its published config has no such
    key, llama.cpp's converter says, and the head is found by its tensors).

    transparent (as mtp_checkpoints.py's): the MTP layer's residual writers zero (the layer passes
    its input through, so fitting mtp.fc and the norms is exact gradient descent) and the model's
    own scaled by 0.1, so each greedy token depends mostly on the one before: answers a head of one
    projection learns in seconds."""
    if transparent:
        changes["scaled_residual"] = True
    path, hf = hybrid_checkpoint(arch, path, tokenizer, **changes)
    mtp = mtp_tensors(hf, torch.Generator().manual_seed(seed))
    if transparent:
        with torch.no_grad():
            for name, t in mtp.items():
                if name.endswith(RESIDUAL_WRITERS):
                    t.zero_()
            for name, p in hf.named_parameters():
                if name.endswith(RESIDUAL_WRITERS):
                    p.mul_(0.1)
        hf.save_pretrained(path)
    save_file(mtp, os.path.join(path, "mtp.safetensors"), metadata={"format": "pt"})
    if arch == "qwen3next":
        return path, hf, mtp
    with open(os.path.join(path, "config.json")) as f:
        d = json.load(f)
    d["mtp_num_hidden_layers"] = 1
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f)
    return path, hf, mtp


def mtp_gguf(path: str, out: str, qtype: str = "f32") -> str:
    """The checkpoint at `path` (qwen35_mtp_checkpoint's, fitted or not) as the GGUF llama.cpp's
    converter writes of it without --no-mtp (blk.N.nextn.*, nextn_predict_layers), --outtype
    qtype."""
    mtp = load_file(os.path.join(path, "mtp.safetensors"))
    return write_gguf(path, path, out, qtype=qtype, mtp=mtp)
