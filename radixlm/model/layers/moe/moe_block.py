"""A sparse MoE block (SGLang's FusedMoE + the model's SparseMoeBlock): router, top-k, the experts
through `fused_experts`, the optional shared expert with its sigmoid gate (Qwen2-MoE).

Weights: w13 = [gate; up] rows per expert, w2 = down, each held as `ExpertWeights`; float ones are
parameters [experts, rows, cols] (filled in place by the loader, or at random for benchmarks),
quantized ones (a GGUF's 3-D blocks as stored, or --quantization per expert) uint8 parameters.

Expert parallelism (the ep group, ep_size 1 or tp_size): this rank holds experts
[start, start + num_experts / ep_size) and computes them for every token routed to any of them,
then the ranks' partial sums are all-reduced (SGLang's --moe-a2a-backend none; expert_dispatch.py,
which under DP attention first gathers every rank's tokens). Routing runs where the tokens are
(every rank alike under TP: replicated router weights, same inputs), so the routes travel with them.

Expert load (`expert_load`): tokens routed to each expert since start, counted by a scatter-add per
forward (no host sync: torch's bincount reads its input's maximum back on CUDA); read on a scrape
(expert_load_info).

The experts' computation (fused_moe.experts_path: the native CPU op, the Triton kernels on CUDA,
torch) is chosen once the weights are in, from their device and format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import GroupCoordinator, get_ep_group
from radixlm.model.layers.moe.expert_dispatch import LocalExperts, expert_dispatch, local_share
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.moe.fused_moe import ExpertsFn, experts_path
from radixlm.model.layers.moe.topk import BiasedTopKRouting, TopKRouting
from radixlm.model.layers.router_gemm import router_logits
from radixlm.model.tp_shard import divide


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    renormalize: bool  # top-k weights renormalized to sum to 1 (topk.py)


class RouterGate(nn.Module):
    """A float matrix never quantized (routing decisions are sensitive; SGLang keeps the gate
    unquantized too): the router [experts, hidden], or Qwen2-MoE's shared-expert gate [1, hidden].
    """

    def __init__(self, hidden_size: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return router_logits(x, self.weight)


class SparseMoeBlock(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        spec: MoeSpec,
        layer_id: int,
        shared_expert: nn.Module | None = None,
        ep: GroupCoordinator | None = None,
        dispatch: LocalExperts | None = None,
    ):
        """dispatch: the model's expert_dispatch() (one for all its MoE layers), else this layer's
        own."""
        super().__init__()
        ep = ep or get_ep_group()
        self.ep_rank, self.ep_size = ep.rank_in_group, ep.world_size
        self.dispatch = dispatch or expert_dispatch()
        self.layer_id, self.hidden_size, self.spec = layer_id, hidden_size, spec
        self.num_local = divide(spec.num_experts, ep.world_size, "num_experts")
        self.expert_start = ep.rank_in_group * self.num_local
        self.routing = TopKRouting(spec.top_k, spec.renormalize)
        self.gate = RouterGate(hidden_size, spec.num_experts)
        n, inter = self.num_local, spec.intermediate_size
        self.w13_weight = nn.Parameter(torch.empty(n, 2 * inter, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(n, hidden_size, inter), requires_grad=False)
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = RouterGate(hidden_size, 1)
        self.register_buffer(
            "expert_load", torch.zeros(spec.num_experts, dtype=torch.int64), persistent=False
        )
        self.w13: ExpertWeights | None = None
        self.w2: ExpertWeights | None = None
        self._experts: ExpertsFn | None = None  # the path the weights take (_views)
        self._fmts: dict[str, Any] = {}  # w13 / w2 -> QuantFormat of quantized weights
        self._quantized: dict[
            str, ExpertWeights
        ] = {}  # a GGUF's stacked blocks, assembled in finish_loading
        self._loaded: set[tuple[str, int]] = set()  # (gate|up|down, local expert) written

    # -- loading ------------------------------------------------------------------------------
    def local_range(self) -> tuple[int, int]:
        return self.expert_start, self.num_local

    def load_expert(self, proj: str, expert: int | None, tensor: Any) -> None:
        """One checkpoint tensor: expert's matrix (a global id), or, with expert None, all experts
        stacked (the full [num_experts, ...] or this rank's [num_local, ...] when the loader sliced
        it).
        """
        from radixlm.model.layers.quantized import QuantizedTensor

        start, n = self.local_range()
        if expert is not None:
            if not start <= expert < start + n:
                return  # another rank's expert
            local = [expert - start]
            if isinstance(tensor, QuantizedTensor):
                tensor = tensor.dequantize()
            tensor = tensor.unsqueeze(0)
        else:
            local = list(range(n))
            if tensor.data.shape[0] == self.spec.num_experts and n != self.spec.num_experts:
                tensor = (
                    ExpertWeights(
                        tensor.data[start : start + n], tensor.fmt, tensor.rows, tensor.cols
                    )
                    if isinstance(tensor, ExpertWeights)
                    else tensor[start : start + n]
                )
            if tensor.data.shape[0] != n:
                raise ValueError(
                    f"layer {self.layer_id} experts' {proj}: expected {n} experts, "
                    f"got {tensor.data.shape[0]}"
                )
        parts = ("gate", "up") if proj == "gate_up" else (proj,)
        if isinstance(tensor, ExpertWeights):
            inter, hidden = self.spec.intermediate_size, self.hidden_size
            want = {
                "gate": (inter, hidden),
                "up": (inter, hidden),
                "gate_up": (2 * inter, hidden),
                "down": (hidden, inter),
            }[proj]
            if (tensor.rows, tensor.cols) != want:
                raise ValueError(
                    f"layer {self.layer_id} experts' {proj}_proj: expected [{n}, {want[0]},"
                    f" {want[1]}], got [{n}, {tensor.rows}, {tensor.cols}]"
                )
            if tensor.quantized:
                self._quantized[proj] = tensor
                self._loaded.update((p, i) for p in parts for i in local)
                return
            tensor = tensor.data
        inter = self.spec.intermediate_size
        rows = {
            "gate": slice(0, inter),
            "up": slice(inter, 2 * inter),
            "gate_up": slice(0, 2 * inter),
        }
        for j, i in enumerate(local):
            src = tensor[j]
            dst = self.w2_weight.data[i] if proj == "down" else self.w13_weight.data[i, rows[proj]]
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError(
                    f"layer {self.layer_id} expert {start + i} {proj}_proj: expected shape "
                    f"{tuple(dst.shape)}, got {tuple(src.shape)}"
                )
            dst.copy_(src)
        self._loaded.update((p, i) for p in parts for i in local)

    def missing(self) -> list[str]:
        """The expert tensors no checkpoint tensor filled (load_weights names them)."""
        return [
            f"layer {self.layer_id} expert {self.expert_start + i} {p}_proj"
            for i in range(self.num_local)
            for p in ("gate", "up", "down")
            if (p, i) not in self._loaded
        ]

    def finish_loading(self) -> None:
        q = self._quantized
        gate, up = q.pop("gate", None), q.pop("up", None)
        if "gate_up" in q:
            self._set("w13", q.pop("gate_up"))
        elif gate is not None and up is not None and gate.fmt == up.fmt:
            # [gate; up] rows per expert: the blocks of each row stand alone, so rows concatenate.
            self._set(
                "w13",
                ExpertWeights(
                    torch.cat([gate.data, up.data], 1), gate.fmt, 2 * gate.rows, gate.cols
                ),
            )
        else:  # one half stored float or in another format: both halves float
            inter = self.spec.intermediate_size
            for w, rows in ((gate, slice(0, inter)), (up, slice(inter, 2 * inter))):
                if w is not None:
                    self.w13_weight.data[:, rows] = w.dequantize().to(self.w13_weight.dtype)
        if "down" in q:
            self._set("w2", q.pop("down"))
        self._views()

    def _set(self, which: str, w: ExpertWeights) -> None:
        """Hold w as the parameter (quantized blocks stay as they are, in the kernels' 8-row
        interleaved layout where the format has one: 2-2.7x the row-major kernels) and remember its
        format."""
        w = w.interleaved(parts=2 if which == "w13" else 1)  # gate and up rows never share a group
        setattr(self, f"{which}_weight", nn.Parameter(w.data, requires_grad=False))
        self._fmts[which] = w.fmt

    def _views(self) -> None:
        """self.w13 / self.w2: ExpertWeights over the parameters, as fused_experts takes them."""
        inter, hidden = self.spec.intermediate_size, self.hidden_size
        for which, rows, cols in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
            setattr(
                self,
                which,
                ExpertWeights(
                    getattr(self, f"{which}_weight").data, self._fmts.get(which), rows, cols
                ),
            )
        self._experts = experts_path(self.w13.data.device, self.w13, self.w2)

    def quantize_weights(self, fmt_name: str) -> None:
        """--quantization of a float checkpoint: each expert's matrices quantized (those whose input
        size the format cannot block stay float, like the linear layers)."""
        from radixlm.kernels.formats import FORMATS

        self._views()
        for which in ("w13", "w2"):
            w = getattr(self, which)
            if not w.quantized and FORMATS[fmt_name].supports(w.cols):
                self._set(which, ExpertWeights.from_float(w.data.float(), fmt_name))
        self._views()

    # -- forward ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w13 is None:
            self._views()
        weights, ids = self.route(x)
        flat = ids.reshape(-1)
        self.expert_load.scatter_add_(0, flat, torch.ones_like(flat))
        out = self._routed(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights float32 [T, k], expert ids int64 [T, k])."""
        return self.routing.select(self.gate(x))

    def _routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.dispatch.run(x, weights, ids, self._local_experts)

    def _local_experts(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        if self.ep_size == 1:
            return self._experts(x, weights, ids, self.w13, self.w2)
        start, n = self.local_range()
        return local_share(
            x, weights, ids, start, n, lambda h, w, i: self._experts(h, w, i, self.w13, self.w2)
        )

    def idle(self, dtype: torch.dtype) -> None:
        """DP attention, this rank without tokens: join the others' gather (forward_idle)."""
        if self.w13 is None:
            self._views()
        self.dispatch.run_empty(self.hidden_size, self.spec.top_k, dtype, self._local_experts)


class BiasedMoeBlock(SparseMoeBlock):
    """A block whose router picks experts by score + a per-expert bias (topk.BiasedTopKRouting:
    LFM2-MoE, ERNIE 4.5 MoE). `expert_bias` [experts] float32, as HF keeps it; None when the
    config has none (the choice then on the scores alone). shared_experts: always-on experts
    (ERNIE's), ungated, added to the routed ones' output."""

    def __init__(
        self,
        hidden_size: int,
        spec: MoeSpec,
        layer_id: int,
        routing: BiasedTopKRouting,
        has_bias: bool = True,
        shared_experts: nn.Module | None = None,
        dispatch: LocalExperts | None = None,
    ):
        super().__init__(hidden_size, spec, layer_id, dispatch=dispatch)
        self.routing = routing
        bias = torch.zeros(spec.num_experts, dtype=torch.float32) if has_bias else None
        self.expert_bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.shared_experts = shared_experts

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.routing.select(self.gate(x), self.expert_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out if self.shared_experts is None else out + self.shared_experts(x)


def expert_load_info(model: nn.Module) -> dict:
    """{"expert_load": {layer: [tokens routed to expert e, ...]}} for a MoE model, else {}."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    if not blocks:
        return {}
    return {"expert_load": {str(b.layer_id): b.expert_load.tolist() for b in blocks}}
