"""The native argmax_rows against torch.argmax: random rows, ties, NaNs, -inf, rows split over the
threads and rows taken whole, and the sampler's greedy path on it."""

import pytest
import torch

from radixlm.model.layers.sampler import argmax_rows


# (rows, vocab): one long row split over the threads (>= 65,536 values), several long rows,
# rows under the split size, a tail of 1..7 values, a single value.
@pytest.mark.parametrize(
    "rows,vocab", [(1, 248320), (3, 151939), (2, 65539), (17, 5000), (5, 7), (1, 1), (1, 65536)]
)
def test_argmax_rows_is_torch_argmax(kernel_ops, rows, vocab):
    g = torch.Generator().manual_seed(rows * 31 + vocab)
    x = torch.randn(rows, vocab, generator=g)
    assert torch.equal(kernel_ops.argmax_rows(x), torch.argmax(x, -1))
    # the maximum at several places: on a split row, in the first chunk and in the second
    tied = x.clone()
    top = tied.max(-1, keepdim=True).values + 1
    for col in (vocab - 1, vocab // 2 + 1, vocab // 3):
        tied[:, col : col + 1] = top
    assert torch.equal(kernel_ops.argmax_rows(tied), torch.argmax(tied, -1))
    # a NaN counts as the maximum: the first NaN wins
    nan = x.clone()
    nan[:, vocab - 1] = float("nan")
    nan[0, vocab // 3] = float("nan")
    assert torch.equal(kernel_ops.argmax_rows(nan), torch.argmax(nan, -1))
    low = torch.full((rows, vocab), float("-inf"))
    assert torch.equal(kernel_ops.argmax_rows(low), torch.argmax(low, -1))
    # a strided view (the op reads a contiguous copy)
    wide = torch.randn(rows, 2 * vocab, generator=g)[:, ::2]
    assert torch.equal(kernel_ops.argmax_rows(wide), torch.argmax(wide, -1))


def test_argmax_rows_rejects_bad_logits_by_name(kernel_ops):
    with pytest.raises(RuntimeError, match="argmax_rows: logits must be float32"):
        kernel_ops.argmax_rows(torch.randn(2, 10, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="argmax_rows: logits must be float32"):
        kernel_ops.argmax_rows(torch.randn(10))
    with pytest.raises(RuntimeError, match="vocab > 0"):
        kernel_ops.argmax_rows(torch.randn(2, 0))


def test_sampler_argmax_takes_the_native_op_on_cpu_float32(kernel_ops):
    x = torch.randn(4, 1000)
    assert torch.equal(argmax_rows(x), kernel_ops.argmax_rows(x))
    half = x.to(torch.bfloat16)  # not float32: torch's own
    assert torch.equal(argmax_rows(half), torch.argmax(half, -1))
    assert argmax_rows(torch.randn(0, 5)).shape == (0,)
