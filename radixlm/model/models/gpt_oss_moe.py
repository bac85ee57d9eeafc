"""gpt-oss's mixture of experts (HF GptOssMLP): a router with a bias, softmax over the top-k
logits, and experts with biases and a clamped SwiGLU. SparseMoeBlock's fused paths have neither
the biases nor this activation, so the experts run here in torch, one matmul per expert touched.

Parameters keep HF's names and layouts (x @ W, not W.T): gate_up_proj [E, hidden, 2 * inter]
with gate and up interleaved by column (gate = [..., ::2], up = [..., 1::2]), down_proj
[E, inter, hidden]; a GGUF's separate gate / up experts are interleaved into it at load.

A quantized GGUF's experts (MXFP4 in the released files, or any format the kernels read) stay in
their blocks instead (`set_quantized`: ExpertWeights, gate and up rows interleaved the same way),
never a float copy. On the CPU, `finish_loading` lays them out for the native fused_moe op (w13 =
[gate; up] rows, with the biases and the clamped SwiGLU: one op per layer instead of two matmuls per
expert and the activation's ~20 small ops); elsewhere each expert touched runs the quantized linear
kernel with its bias.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.model.host_copy import to_device
from radixlm.model.layers.moe import native
from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.router_gemm import router_logits


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """HF GptOssExperts._apply_gate: (up + 1) * gate * sigmoid(alpha * gate), gate clamped above
    and up on both sides at limit."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class GptOssTopKRouter(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(num_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights float32 [T, k], expert ids [T, k]): a softmax over the top-k
        logits (torch.topk as HF: ties break alike)."""
        top, ids = torch.topk(router_logits(x, self.weight, self.bias), self.top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=torch.float32), ids


class GptOssExperts(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        n, hidden, inter = config.num_local_experts, config.hidden_size, config.intermediate_size
        empty = lambda *shape: nn.Parameter(torch.empty(*shape), requires_grad=False)
        self.gate_up_proj = empty(n, hidden, 2 * inter)
        self.gate_up_proj_bias = empty(n, 2 * inter)
        self.down_proj = empty(n, inter, hidden)
        self.down_proj_bias = empty(n, hidden)
        # Older configs name only the limit; the alpha of the released models is fixed.
        self.alpha = float(getattr(config, "swiglu_alpha", 1.702))
        self.limit = float(getattr(config, "swiglu_limit", 7.0))
        # Quantized experts (set_quantized): empty while the float parameters hold them.
        self.quantized: dict[str, ExpertWeights] = {}
        # The native op's layout of them (finish_loading): w13 = [gate; up] rows and w2, and
        # their biases b13 (in w13's row order) and b2.
        self.fused: dict[str, ExpertWeights] = {}
        self.fused_bias: dict[str, torch.Tensor] = {}
        self._laid_out = True  # False from set_quantized until finish_loading
        self.routed = (n, config.num_experts_per_tok)  # (what bench one-batch prices a step at)

    def set_quantized(self, name: str, w: ExpertWeights) -> None:
        """name: gate_up_proj (gate / up rows interleaved) or down_proj, row-major blocks as
        loaded; the float one goes. finish_loading lays them out for the kernels."""
        self.quantized[name] = w
        self._laid_out, self.fused = False, {}
        getattr(self, name).data = torch.empty(0)

    def finish_loading(self) -> None:
        """After load_weights: the quantized experts move into the native op's layout where it
        runs them (rows permuted and 8-row interleaved: the same blocks), else into the kernels'
        interleaved layout for one matmul per expert; the biases follow each load."""
        if self.quantized and not self._laid_out:
            gate_up, down = self.quantized.get("gate_up_proj"), self.quantized.get("down_proj")
            both = gate_up is not None and down is not None
            if both and native.supports(gate_up.data.device, gate_up, down):
                self.fused = {
                    "w13": _gate_rows_first(gate_up).interleaved(2),
                    "w2": down.interleaved(),
                }
                self.quantized = {}
            else:
                self.quantized = {n: w.interleaved() for n, w in self.quantized.items()}
            self._laid_out = True
        if self.fused:
            b = self.gate_up_proj_bias.float()
            self.fused_bias = {
                "b13": torch.cat((b[:, ::2], b[:, 1::2]), dim=1).contiguous(),
                "b2": self.down_proj_bias.float().contiguous(),
            }

    def _project(self, name: str, e: int, x: torch.Tensor) -> torch.Tensor:
        bias = getattr(self, name + "_bias")[e]
        w = self.quantized.get(name)
        if w is None:
            return x @ getattr(self, name)[e] + bias
        from radixlm.kernels.ops import ops

        return ops().qlinear(x.float().contiguous(), w.data[e], w.fmt.kernel_id, bias.float())

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, hidden], weights / ids [T, k] -> [T, hidden]. One matmul pair per expert touched,
        over its tokens (grouped on the host: one read of the ids, no sort); the activation of all
        of them at once; then each token sums its k rows in slot order (its output does not depend
        on which other tokens share its experts)."""
        if self.fused:
            f, b = self.fused, self.fused_bias
            return native.run_with(
                x,
                weights,
                ids,
                f["w13"],
                f["w2"],
                b["b13"],
                b["b2"],
                "swiglu",
                self.alpha,
                self.limit,
            )
        T, k = ids.shape
        groups: dict[int, list[int]] = {}
        for pair, e in enumerate(ids.reshape(-1).tolist()):
            groups.setdefault(e, []).append(pair)
        order = [(e, to_device(pairs, torch.int64, x.device)) for e, pairs in groups.items()]
        gate_up = [
            self._project("gate_up_proj", e, x if T == 1 else x.index_select(0, pairs // k))
            for e, pairs in order
        ]
        sizes = [len(p) for _, p in order]
        h = clamped_swiglu(
            torch.cat(gate_up) if len(gate_up) > 1 else gate_up[0], self.alpha, self.limit
        )
        rows = x.new_empty(T * k, x.shape[-1])  # each (token, slot) pair's expert output
        for (e, pairs), part in zip(order, h.split(sizes)):
            rows.index_copy_(0, pairs, self._project("down_proj", e, part).to(rows.dtype))
        rows, weights = rows.view(T, k, -1), weights.to(x.dtype)
        out = weights[:, 0, None] * rows[:, 0]
        for j in range(1, k):
            out = out + weights[:, j, None] * rows[:, j]
        return out


class GptOssSparseMoeBlock(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.router = GptOssTopKRouter(
            config.hidden_size, config.num_local_experts, config.num_experts_per_tok
        )
        self.experts = GptOssExperts(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(x)
        return self.experts(x, weights, ids)


def _gate_rows_first(gate_up: ExpertWeights) -> ExpertWeights:
    """gate_up's rows (gate, up, gate, ... as HF's columns) reordered to [all gate; all up], the
    fused op's w13 (row-major blocks: one stored row per weight row)."""
    rows = torch.arange(gate_up.rows)
    order = torch.cat((rows[::2], rows[1::2]))
    return ExpertWeights(
        gate_up.data[:, order].contiguous(), gate_up.fmt, gate_up.rows, gate_up.cols
    )
