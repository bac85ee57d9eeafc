"""The torch fused-experts path against a naive per-token loop over the top-k experts."""

import pytest
import torch
import torch.nn.functional as F

from radixlm.model.layers.moe.experts import ExpertWeights
from radixlm.model.layers.moe.fused_moe import fused_experts, fused_experts_torch


def naive(x, tw, ti, w13, w2):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e = int(ti[t, j])
            gate, up = (x[t] @ w13[e].T).chunk(2)
            out[t] += tw[t, j] * ((F.silu(gate) * up) @ w2[e].T)
    return out


@pytest.mark.parametrize("T,k", [(1, 1), (1, 2), (7, 2), (33, 3)])
@pytest.mark.parametrize("fmt", [None, "q8_0", "q4_0"])
def test_fused_experts_equal_the_naive_loop(T, k, fmt):
    g = torch.Generator().manual_seed(T * 10 + k)
    H, I, E = 64, 32, 6
    x = torch.randn(T, H, generator=g)
    w13, w2 = torch.randn(E, 2 * I, H, generator=g) * 0.1, torch.randn(E, H, I, generator=g) * 0.1
    tw, ti = torch.topk(torch.randn(T, E, generator=g).softmax(-1), k)
    q13, q2 = ExpertWeights.from_float(w13, fmt), ExpertWeights.from_float(w2, fmt)
    out = fused_experts_torch(x, tw, ti, q13, q2)
    torch.testing.assert_close(
        fused_experts(x, tw, ti, q13, q2), out, atol=1e-5, rtol=1e-5
    )  # any path
    if fmt is None:
        torch.testing.assert_close(out, naive(x, tw, ti, w13, w2), atol=1e-5, rtol=1e-5)
    else:  # the weights as the kernels see them; activations rounded to int8 per block
        ref = naive(x, tw, ti, q13.dequantize(), q2.dequantize())
        assert (out - ref).abs().max() <= 0.03 * ref.abs().max()
