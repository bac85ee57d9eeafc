"""Nemotron-H's MoE block (HF NemotronHMoE: layer type "moe", pattern letter E; Nemotron-3 Nano
30B-A3B): DeepSeek-V3's router (sigmoid scores, e_score_correction_bias for the choice, groups
scored by their two best experts, the unbiased scores as weights, norm_topk_prob with +1e-20,
routed_scaling_factor; layers/moe/deepseek_routing.py's noaux_tc), float32 as HF keeps it;
routed experts WITHOUT a gate (down(relu2(up x)), HF's NemotronHExperts), one shared expert
(Nemotron-H's MLP of moe_shared_expert_intermediate_size) on the block's input, added.

The experts are held stacked (up [experts, intermediate, hidden], down [experts, hidden,
intermediate]), filled from NVIDIA's per-expert tensors (`mixer.experts.E.up_proj.weight`),
transformers 5's stacked ones (`mixer.experts.up_proj`) or a GGUF's 3-D blocks, which stay
quantized (ExpertWeights; each expert's matmul through the native qlinear). On CUDA float experts
run the Triton grouped GEMM (kernels/triton_ops/fused_moe.py, gateless_experts_triton: no host
sync); elsewhere one matmul per expert touched (fused_moe.py's torch
path, its op order: a token sums its k rows in slot order).
Split over N expert-parallel ranks, rank r holds experts [r * E / N, (r + 1) * E / N)
(layers/moe/expert_dispatch.py); the hybrids refuse tensor parallelism for now, so no server
starts one so (untested).
Nemotron 3 Super's moe_latent_size: the routed experts between fc1_latent_proj (hidden -> latent)
and fc2_latent_proj (latent -> hidden), in the latent space.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.distributed.parallel_state import get_ep_group
from radixlm.model.layers.linear import Linear
from radixlm.model.layers.moe.deepseek_routing import DeepseekRouting, TopkMethod
from radixlm.model.layers.moe.expert_dispatch import LocalExperts, local_share
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.models.deepseek_moe import DeepseekGate
from radixlm.model.tp_shard import divide

PROJS = ("up_proj", "down_proj")


def _linear(x: torch.Tensor, w: ExpertWeights, e: int) -> torch.Tensor:
    if not w.quantized:
        return F.linear(x, w.data[e].to(x.dtype))
    from radixlm.kernels.ops import ops

    q = w.expert(e)
    out = ops().qlinear(x.float().contiguous(), q.data.contiguous(), q.fmt.kernel_id, None)
    return out.to(x.dtype)


def _triton(device: torch.device) -> bool:
    """The Triton grouped GEMM on CUDA (no host sync); else the per-expert loop."""
    from radixlm.kernels import triton_ops

    return device.type == "cuda" and triton_ops.available(device)


class NemotronHExperts(nn.Module):
    """This rank's routed experts, stacked; called with local expert ids."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, act):
        super().__init__()
        ep = get_ep_group()
        self.num_experts, self.hidden_size, self.intermediate_size = (
            num_experts,
            hidden_size,
            intermediate_size,
        )
        self.num_local = n = divide(num_experts, ep.world_size, "n_routed_experts")
        self.start = ep.rank_in_group * n
        self.act_fn = act
        self.up_proj = nn.Parameter(
            torch.empty(n, intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.empty(n, hidden_size, intermediate_size), requires_grad=False
        )
        self._quantized: dict[str, ExpertWeights] = {}  # a GGUF's blocks, until finish_loading
        self._fmts: dict[str, Any] = {}  # up_proj / down_proj -> QuantFormat of quantized ones
        self._loaded: set[tuple[str, int]] = set()

    def _shape(self, proj: str) -> tuple[int, int]:
        inter, hidden = self.intermediate_size, self.hidden_size
        return (inter, hidden) if proj == "up_proj" else (hidden, inter)

    @torch.no_grad()
    def load(self, proj: str, expert: int | None, tensor: Any) -> None:
        """One checkpoint tensor: expert `expert`'s matrix (a global id), or with expert None all
        experts stacked (all of them, or this rank's when the loader sliced them)."""
        n, start = self.num_local, self.start
        rows, cols = self._shape(proj)
        if expert is not None:
            if not start <= expert < start + n:
                return  # another rank's expert
            if not isinstance(tensor, torch.Tensor):
                tensor = tensor.dequantize()  # a QuantizedTensor of one expert
            if tuple(tensor.shape) != (rows, cols):
                raise ValueError(
                    f"expert {expert} {proj}: expected shape {(rows, cols)}, got"
                    f" {tuple(tensor.shape)}"
                )
            getattr(self, proj).data[expert - start].copy_(tensor)
            self._loaded.add((proj, expert - start))
            return
        data = tensor.data
        if data.shape[0] == self.num_experts and n != self.num_experts:
            data = data[start : start + n]
        if isinstance(tensor, ExpertWeights):
            if (tensor.rows, tensor.cols) != (rows, cols) or data.shape[0] != n:
                raise ValueError(
                    f"experts' {proj}: expected [{n}, {rows}, {cols}], got"
                    f" [{data.shape[0]}, {tensor.rows}, {tensor.cols}]"
                )
            if tensor.quantized:
                self._quantized[proj] = ExpertWeights(data, tensor.fmt, rows, cols)
                self._loaded.update((proj, i) for i in range(n))
                return
        if tuple(data.shape) != (n, rows, cols):
            raise ValueError(
                f"experts' {proj}: expected shape {(n, rows, cols)}, got {tuple(data.shape)}"
            )
        getattr(self, proj).data.copy_(data)
        self._loaded.update((proj, i) for i in range(n))

    def missing(self) -> list[str]:
        return [
            f"expert {self.start + i} {p}"
            for i in range(self.num_local)
            for p in PROJS
            if (p, i) not in self._loaded
        ]

    def finish_loading(self) -> None:
        """The quantized blocks become the parameters (they move with the model)."""
        for proj, w in self._quantized.items():
            setattr(self, proj, nn.Parameter(w.data, requires_grad=False))
            self._fmts[proj] = w.fmt
        self._quantized.clear()

    def _weights(self, proj: str) -> ExpertWeights:
        rows, cols = self._shape(proj)
        return ExpertWeights(getattr(self, proj).data, self._fmts.get(proj), rows, cols)

    def forward(
        self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """hidden [T, H], weights / local ids [T, k] -> [T, H]."""
        up, down = self._weights("up_proj"), self._weights("down_proj")
        if not up.quantized and not down.quantized and _triton(hidden.device):
            from radixlm.kernels.triton_ops.fused_moe import gateless_experts_triton

            return gateless_experts_triton(
                hidden,
                topk_weights,
                topk_ids,
                up.data.to(hidden.dtype),
                down.data.to(hidden.dtype),
                self.act_fn,
            )
        T, k = topk_ids.shape
        flat = topk_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_local).tolist()
        rows = hidden.new_zeros(T * k, hidden.shape[-1])
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            pairs = order[start : start + n]
            x = hidden.index_select(0, pairs // k)
            rows.index_copy_(0, pairs, _linear(self.act_fn(_linear(x, up, e)), down, e))
            start += n
        rows, weights = rows.view(T, k, -1), topk_weights.to(hidden.dtype)
        out = torch.zeros_like(hidden)
        for j in range(k):
            out = out + weights[:, j, None] * rows[:, j]
        return out

    def run(self, hidden, topk_weights, topk_ids) -> torch.Tensor:
        """With global expert ids: this rank's share of the output."""
        if self.num_local == self.num_experts:
            return self(hidden, topk_weights, topk_ids)
        return local_share(hidden, topk_weights, topk_ids, self.start, self.num_local, self)


class NemotronHMoE(nn.Module):
    def __init__(self, config: Any, shared_experts: nn.Module, act, dispatch: LocalExperts):
        super().__init__()
        self.dispatch = dispatch
        latent = getattr(config, "moe_latent_size", None)
        bias = bool(getattr(config, "mlp_bias", False))
        # Nemotron 3 Super: the routed experts run in a smaller space (the router and the shared
        # expert on the block's input)
        self.fc1_latent_proj = Linear(config.hidden_size, latent, bias) if latent else None
        self.fc2_latent_proj = Linear(latent, config.hidden_size, bias) if latent else None
        self.routing = DeepseekRouting(
            num_experts=config.n_routed_experts,
            top_k=config.num_experts_per_tok,
            method=TopkMethod.NOAUX_TC,
            n_group=config.n_group or 1,
            topk_group=config.topk_group or 1,
            norm_topk_prob=bool(config.norm_topk_prob),
            routed_scaling_factor=float(config.routed_scaling_factor or 1.0),
        )
        self.gate = DeepseekGate(config.n_routed_experts, config.hidden_size, has_bias=True)
        self.experts = NemotronHExperts(
            config.n_routed_experts, latent or config.hidden_size, config.moe_intermediate_size, act
        )
        self.shared_experts = shared_experts

    def forward(self, hidden: torch.Tensor, fb: Any = None) -> torch.Tensor:
        weights, ids = self.routing.select(self.gate(hidden), self.gate.e_score_correction_bias)
        if self.routing.top_k == 1 and self.routing.norm_topk_prob:  # HF normalizes one too
            weights = weights / (weights + 1e-20)
        x = hidden if self.fc1_latent_proj is None else self.fc1_latent_proj(hidden)
        out = self.dispatch.run(x, weights, ids, self.experts.run)
        if self.fc2_latent_proj is not None:
            out = self.fc2_latent_proj(out)
        return out + self.shared_experts(hidden, fb)

    def idle(self, dtype: torch.dtype) -> None:
        """DP attention, this rank without tokens: join the others' gather (forward_idle)."""
        self.dispatch.run_empty(
            self.experts.hidden_size, self.routing.top_k, dtype, self.experts.run
        )
