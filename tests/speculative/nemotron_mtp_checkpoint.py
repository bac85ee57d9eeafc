"""A tiny Nemotron-3 (Nemotron-H with MoE blocks) checkpoint with its multi-token-prediction block
as NVIDIA's checkpoints carry it: `mtp.layers.0` an attention block holding the fusion (enorm,
hnorm, eh_proj), `mtp.layers.1` a MoE block (per-expert tensors, as NVIDIA's) holding the head's
final_layernorm, in mtp.safetensors beside the model's, announced by num_nextn_predict_layers 1 and
mtp_layers_block_type [full_attention, moe]; and the GGUF llama.cpp's converter writes of it
(conversion/nemotron.py NemotronHModel: the block folded into blk.N; ssm_gguf_writer.py).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file

from tests.hybrid.test_nemotron_h_moe import checkpoint
from tests.model.hybrid_checkpoints import RESIDUAL_WRITERS, write_gguf

MTP_TYPES = ["full_attention", "moe"]
_FUSION = ("enorm.weight", "hnorm.weight", "eh_proj.weight")


def mtp_tensors(hf, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The MTP blocks: each a block of the model's of its type (shapes only: drawn afresh), the
    routed experts split per expert; the fusion and the final norm."""
    cfg = hf.config
    h = cfg.hidden_size
    out = {
        "mtp.layers.0.enorm.weight": 1 + 0.2 * torch.randn(h, generator=g),
        "mtp.layers.0.hnorm.weight": 1 + 0.2 * torch.randn(h, generator=g),
        "mtp.layers.0.eh_proj.weight": torch.randn(h, 2 * h, generator=g) * (2 * h) ** -0.5,
        f"mtp.layers.{len(MTP_TYPES) - 1}.final_layernorm.weight": 1
        + 0.2 * torch.randn(h, generator=g),
    }
    state = hf.state_dict()
    for i, kind in enumerate(MTP_TYPES):
        src = f"model.layers.{cfg.layers_block_type.index(kind)}."
        for name, t in state.items():
            if not name.startswith(src):
                continue
            rest = name.removeprefix(src)
            if rest.endswith("norm.weight"):
                x = 1 + 0.2 * torch.randn(t.shape, generator=g)
            elif rest.endswith("e_score_correction_bias"):
                x = 0.1 * torch.randn(t.shape, generator=g)
            else:
                x = torch.randn(t.shape, generator=g) * t.shape[-1] ** -0.5
            x = x.bfloat16().float()
            if rest in ("mixer.experts.up_proj", "mixer.experts.down_proj"):
                proj = rest.rpartition(".")[2]
                for j in range(x.shape[0]):
                    out[f"mtp.layers.{i}.mixer.experts.{j}.{proj}.weight"] = x[j].clone()
            else:
                out[f"mtp.layers.{i}.{rest}"] = x
    return out


def nemotron_mtp_checkpoint(
    path: str, tokenizer, seed: int = 5, transparent: bool = False, **changes
):
    """(path, hf model, the MTP tensors). transparent (as qwen35_mtp_checkpoint's): the MTP
    blocks' residual writers zero (the head passes its fusion through, so fitting eh_proj and the
    norms is exact gradient descent) and the model's own scaled by 0.1, so each greedy token
    depends mostly on the one before."""
    changes = dict(num_nextn_predict_layers=1, mtp_layers_block_type=MTP_TYPES, **changes)
    path, hf = checkpoint(path, tokenizer, scaled_residual=transparent, **changes)
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
    return path, hf, mtp


def stacked_block(mtp: dict, i: int) -> dict[str, torch.Tensor]:
    """MTP block i's tensors under its own names, the experts stacked as transformers 5 holds
    them (mixer.experts.{up,down}_proj [experts, rows, cols]); no fusion, no final norm."""
    out, experts = {}, {}
    prefix = f"mtp.layers.{i}."
    for name, t in mtp.items():
        if not name.startswith(prefix):
            continue
        rest = name.removeprefix(prefix)
        if rest in _FUSION or rest == "final_layernorm.weight":
            continue
        if rest.startswith("mixer.experts."):
            _, _, j, proj, _ = rest.split(".")
            experts.setdefault(proj, {})[int(j)] = t
            continue
        out[rest] = t
    for proj, by_id in experts.items():
        out[f"mixer.experts.{proj}"] = torch.stack([by_id[j] for j in sorted(by_id)])
    return out


def mtp_gguf(path: str, out: str, qtype: str = "f32") -> str:
    """The checkpoint at `path` (fitted or not) as llama.cpp's converter writes it with the MTP
    block kept (the default: no --no-mtp), --outtype qtype."""
    mtp = load_file(os.path.join(path, "mtp.safetensors"))
    return write_gguf(path, path, out, qtype=qtype, mtp=mtp)
