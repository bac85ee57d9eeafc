"""DeepSeek's MoE feed-forward (V2/V3): a float32 router (deepseek_routing.py), the routed experts
through the fused MoE layer (layers/moe/fused_moe.py), plus always-on shared experts.

Checkpoints name each expert's projections (`mlp.experts.E.gate_proj.weight`, ...); the experts
are held stacked as the fused layer reads them (w13 = [gate; up] rows, w2 = down), and
DeepseekExperts.load_shard puts each checkpoint tensor in its place (transformers 5's stacked
`mlp.experts.gate_up_proj` / `down_proj` are taken as they are).

With --ep-size N (under --enable-dp-attention) a rank holds experts [r * E / N, (r + 1) * E / N)
and computes their share of every rank's tokens (layers/moe/expert_dispatch.py); the router, the
shared experts and the dense layers run on each rank's own tokens (SGLang's --moe-dense-tp-size 1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import get_ep_group
from radixlm.model.layers.moe.deepseek_routing import DeepseekRouting
from radixlm.model.layers.moe.expert_dispatch import LocalExperts, local_share
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.moe.fused_moe import fused_experts
from radixlm.model.tp_shard import divide

# Shard ids of DeepseekExperts' parameters: w13 of expert e is 2e (gate) and 2e + 1 (up), w2's is e.
# A stacked 3-D checkpoint tensor fills every shard at once.
ALL_EXPERTS = -1


class DeepseekExperts(nn.Module):
    """This rank's routed experts (all of them unless --ep-size splits them), stacked; called with
    global expert ids, it returns their share of the output."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        ep = get_ep_group()
        self.num_experts, self.hidden_size, self.intermediate_size = (
            num_experts,
            hidden_size,
            intermediate_size,
        )
        self.num_local = n = divide(num_experts, ep.world_size, "n_routed_experts")
        self.start = ep.rank_in_group * n
        self.w13 = nn.Parameter(
            torch.empty(n, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.w2 = nn.Parameter(torch.empty(n, hidden_size, intermediate_size), requires_grad=False)

    def num_shards(self, kind: str) -> int:
        return 2 * self.num_local if kind == "w13" else self.num_local

    @torch.no_grad()
    def load_shard(self, param: nn.Parameter, tensor: torch.Tensor, shard: int) -> list[int]:
        """Copy one checkpoint tensor in (shard: global ids as above); -> the local shard ids it
        filled (none for another rank's expert)."""
        n, start = self.num_local, self.start
        if shard == ALL_EXPERTS:
            if tensor.shape[0] == self.num_experts:
                tensor = tensor[start : start + n]
            if tensor.shape != param.shape:
                raise ValueError(
                    f"stacked experts: expected shape {tuple(param.shape)}, got"
                    f" {tuple(tensor.shape)}"
                )
            param.copy_(tensor)
            return list(range(2 * n if param is self.w13 else n))
        e, part = divmod(shard, 2) if param is self.w13 else (shard, 0)
        if not start <= e < start + n:
            return []
        e -= start
        if param is self.w13:
            dst = param[e, part * self.intermediate_size : (part + 1) * self.intermediate_size]
        else:
            dst = param[e]
        if tensor.shape != dst.shape:
            raise ValueError(
                f"expert tensor: expected shape {tuple(dst.shape)}, got {tuple(tensor.shape)}"
            )
        dst.copy_(tensor)
        return [2 * e + part if param is self.w13 else e]

    def forward(
        self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        w13 = ExpertWeights(self.w13, None, 2 * self.intermediate_size, self.hidden_size)
        w2 = ExpertWeights(self.w2, None, self.hidden_size, self.intermediate_size)

        def fused(h, w, i):
            return fused_experts(h, w.to(h.dtype), i, w13, w2)

        if self.num_local == self.num_experts:
            return fused(hidden, weights, ids)
        return local_share(hidden, weights, ids, self.start, self.num_local, fused)


class DeepseekGate(nn.Module):
    """The router's weight [experts, hidden] (float32, as transformers keeps it) and V3's
    e_score_correction_bias."""

    def __init__(self, num_experts: int, hidden_size: int, has_bias: bool):
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(num_experts, hidden_size, dtype=torch.float32), requires_grad=False
        )
        self.e_score_correction_bias = (
            nn.Parameter(torch.empty(num_experts, dtype=torch.float32), requires_grad=False)
            if has_bias
            else None
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden.float(), self.weight.float())


class DeepseekMoE(nn.Module):
    def __init__(self, config: Any, v3: bool, shared_experts: nn.Module, dispatch: LocalExperts):
        """dispatch: the model's expert_dispatch() (one for all its MoE layers)."""
        super().__init__()
        self.dispatch = dispatch
        self.routing = DeepseekRouting.from_config(config, v3)
        self.gate = DeepseekGate(config.n_routed_experts, config.hidden_size, has_bias=v3)
        self.experts = DeepseekExperts(
            config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        )
        self.shared_experts = shared_experts

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weights, ids = self.routing.select(self.gate(hidden), self.gate.e_score_correction_bias)
        out = self.dispatch.run(hidden, weights, ids, self.experts)
        return out + self.shared_experts(hidden) if self.shared_experts is not None else out

    def idle(self, dtype: torch.dtype) -> None:
        """DP attention, this rank without tokens: join the others' gather (forward_idle)."""
        self.dispatch.run_empty(self.experts.hidden_size, self.routing.top_k, dtype, self.experts)


def expert_counts(config: Any) -> tuple[int, int, int]:
    """(MoE layers, routed experts per layer, experts each token uses) of a DeepSeek config."""
    return (
        sum(is_moe_layer(config, i) for i in range(config.num_hidden_layers)),
        config.n_routed_experts or 0,
        config.num_experts_per_tok or 0,
    )


def is_moe_layer(config: Any, layer_id: int) -> bool:
    """DeepSeek's rule: the first first_k_dense_replace layers are dense, then every
    moe_layer_freq-th (1 in every released model)."""
    return (
        bool(config.n_routed_experts)
        and layer_id >= (config.first_k_dense_replace or 0)
        and layer_id % (getattr(config, "moe_layer_freq", None) or 1) == 0
    )
