"""The native router_gemm (a MoE router's float32 logits) against float64, its batch and thread
invariance, its errors, and the router layers' choice between it and F.linear."""

import pytest
import torch
import torch.nn.functional as F

from radixlm.model.layers.moe.moe_block import RouterGate
from radixlm.model.layers.router_gemm import ROUTER_GEMM_MAX_ROWS, router_logits

# float32 dots of up to ~3k terms against float64: reassociation only, relative to the dot's
# magnitude; a wrong row, column or tail is O(1).
RTOL = 1e-5


def reference(x, w, bias=None):
    y = x.double() @ w.double().T
    return y if bias is None else y + bias.double()


# K: a multiple of 16, of 8 only, with a scalar tail, shorter than a chunk; N: tiles of 4 and a
# remainder; sizes above 256 KB split over the threads.
@pytest.mark.parametrize(
    "n,k", [(256, 2048), (32, 2880), (7, 100), (1, 2048), (66, 2056), (5, 5), (130, 1030)]
)
def test_router_gemm_matches_float64_and_is_batch_invariant(kernel_ops, n, k):
    g = torch.Generator().manual_seed(n * 7 + k)
    w, bias = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    x = torch.randn(8, k, generator=g)
    y = kernel_ops.router_gemm(x, w)
    ref = reference(x, w)
    scale = (x.double().abs() @ w.double().abs().T).max()
    assert ((y.double() - ref).abs().max() / scale).item() < RTOL
    yb = kernel_ops.router_gemm(x, w, bias)
    assert ((yb.double() - reference(x, w, bias)).abs().max() / scale).item() < RTOL
    # the bias is added after the dot: the logits without it plus it, exactly
    assert torch.equal(yb, y + bias)
    for rows in (1, 3, 8):  # each row alone, and any batch: bitwise the same logits
        for start in range(0, 8, rows):
            part = x[start : start + rows]
            assert torch.equal(kernel_ops.router_gemm(part, w), y[start : start + rows])


def test_router_gemm_same_on_one_thread(kernel_ops):
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(256, 2048, generator=g), torch.randn(2, 2048, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel_ops.router_gemm(x, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(kernel_ops.router_gemm(x, w), one)


def test_router_gemm_rejects_bad_inputs_by_name(kernel_ops):
    w = torch.randn(16, 64)
    with pytest.raises(RuntimeError, match="router_gemm: weight must be float32"):
        kernel_ops.router_gemm(torch.randn(2, 32), w)
    with pytest.raises(RuntimeError, match="router_gemm: weight must be float32"):
        kernel_ops.router_gemm(torch.randn(2, 64), w.half())
    with pytest.raises(RuntimeError, match="router_gemm: x must be float32"):
        kernel_ops.router_gemm(torch.randn(2, 64, dtype=torch.float64), w)
    bias_error = r"router_gemm: bias must be float32 \[experts\] = \[16\]"
    with pytest.raises(RuntimeError, match=bias_error):
        kernel_ops.router_gemm(torch.randn(2, 64), w, torch.randn(15))


def test_router_layers_take_the_native_op_for_decode_batches_only(kernel_ops):
    g = torch.Generator().manual_seed(2)
    gate = RouterGate(96, 40)
    gate.weight.data = torch.randn(40, 96, generator=g)
    bias = torch.randn(40, generator=g)
    x = torch.randn(ROUTER_GEMM_MAX_ROWS + 1, 96, generator=g)
    small = x[:ROUTER_GEMM_MAX_ROWS]
    with torch.no_grad():
        assert torch.equal(gate(small), kernel_ops.router_gemm(small, gate.weight))
        assert torch.equal(gate(x), F.linear(x, gate.weight))
        native = kernel_ops.router_gemm(small, gate.weight, bias)
        assert torch.equal(router_logits(small, gate.weight, bias), native)
        assert torch.equal(router_logits(x, gate.weight, bias), F.linear(x, gate.weight, bias))
