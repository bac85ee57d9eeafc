"""A router's logits: x [T, hidden] times its float32 matrix [experts, hidden] (plus gpt-oss's
bias), and other float32 matrices of a router's size (Gated DeltaNet's in_proj_ba). A decode
batch on the CPU takes the native router_gemm (kernels/csrc/router_gemm.cpp: the matrix's rows
over the threads, where MKL's GEMV runs these sizes on one; each logit in a fixed order, so a
token's logits do not depend on its batch); larger batches, other devices and the torch path take
F.linear. The one-op decoder stacks (qwen3_5_layers.cpp) switch at the same ROUTER_GEMM_MAX_ROWS,
so their results are bitwise these."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.kernels.ops import cpu_float_ops

# Up to this many token rows the native op is faster than MKL (8: 0.7x its time on a 256 x 2048
# router, 16: 1.1x; docs/benchmarks.md); the C++ stacks' ROUTER_GEMM_MAX_ROWS.
ROUTER_GEMM_MAX_ROWS = 8


def router_logits(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    floats = weight.dtype == torch.float32 and (bias is None or bias.dtype == torch.float32)
    if x.dim() == 2 and x.shape[0] <= ROUTER_GEMM_MAX_ROWS and floats:
        ops = cpu_float_ops(x)
        if ops is not None and weight.device.type == "cpu":
            return ops.router_gemm(x, weight, bias)
    return F.linear(x, weight, bias)
