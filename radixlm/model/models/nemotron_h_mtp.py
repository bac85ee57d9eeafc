"""Nemotron-3's multi-token-prediction block (NemotronH with num_nextn_predict_layers > 0): the
blocks config.mtp_layers_block_type lists (Nemotron-3 Nano / Super: one attention block, then one
MoE block), each Nemotron-H's own pre-norm block (NemotronHBlock) on one residual stream.

The checkpoint (NVIDIA's, as SGLang's and vLLM's nemotron_h_mtp.py read it, and llama.cpp's
converter): `mtp.layers.{i}.{norm, mixer.*}` per block; the first block also carries the fusion
`enorm`, `hnorm`, `eh_proj`, the last the head's `final_layernorm` (an RMSNorm in SGLang, vLLM and
TensorRT-LLM; llama.cpp's graph applies it as a LayerNorm). speculative/mtp_checkpoint.py renames
those to the NextN names (enorm, hnorm, eh_proj, shared_head.norm) and `blocks.{i}.*`, and MtpHead
runs the fusion and the final norm around this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.models.nemotron_h import NemotronHBlock

MTP_BLOCK_TYPES = ("full_attention", "moe", "mlp")  # no Mamba block: the head keeps no state


def mtp_block_types(config: Any) -> list[str]:
    """config.mtp_layers_block_type, checked: block types the head runs, one attention block (its
    KV is the draft source's one head KV layer)."""
    types = list(getattr(config, "mtp_layers_block_type", None) or ["full_attention", "moe"])
    bad = [t for t in types if t not in MTP_BLOCK_TYPES]
    if bad or types.count("full_attention") != 1:
        raise ValueError(
            f"mtp_layers_block_type {types}: radixlm runs Nemotron-H heads of one full_attention"
            f" block and {' / '.join(MTP_BLOCK_TYPES[1:])} blocks"
        )
    return types


class NemotronHMtpLayer(nn.Module):
    """The MTP block's decoder part, in a decoder layer's interface: forward(positions, hidden,
    fb, residual) -> (the last block's mixer output, the residual stream)."""

    def __init__(self, config: Any, dispatch=None):
        super().__init__()
        types = mtp_block_types(config)
        self.blocks = nn.ModuleList(NemotronHBlock(config, t, 0, dispatch) for t in types)
        self.attention_block = self.blocks[types.index("full_attention")]

    def forward(self, positions, hidden: torch.Tensor, fb, residual):
        for block in self.blocks:
            hidden, residual = block(positions, hidden, fb, residual)
        return hidden, residual
