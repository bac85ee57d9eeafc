"""The native LoRA delta (kernels/csrc/lora.cpp) against float64, and batch invariant bitwise: a
token's delta is the same bits alone, in any batch, at any position, under any thread count
(torch's GEMM, which it replaced, is not: MKL's row sums depend on the row count and the ISA)."""

import pytest
import torch


def _case(tokens=37, slots=3, width=24, n_in=100, n_out=75, seed=0):
    """Shapes off the 8-lane grid on purpose (in, width and out tails)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, n_in, generator=g)
    a = torch.randn(slots, width, n_in, generator=g) * n_in**-0.5
    b = torch.randn(slots, n_out, width, generator=g) * 0.1
    slot = torch.randint(-1, slots, (tokens,), generator=g)
    base = torch.randn(tokens, n_out, generator=g)
    return x, a, b, slot, base


def _delta(ops, x, a, b, slot, base):
    out = base.clone()
    ops.lora_delta_(x, a, b, slot, out)
    return out


@pytest.mark.parametrize(
    "shape",
    [
        dict(),
        dict(width=48, n_in=576, n_out=960),
        dict(width=8, n_in=64, n_out=8),
        dict(width=3, n_in=5, n_out=1, tokens=1),
    ],
)
def test_matches_float64(kernel_ops, shape):
    x, a, b, slot, base = _case(**shape)
    got = _delta(kernel_ops, x, a, b, slot, base)
    want = base.double().clone()
    for t, s in enumerate(slot.tolist()):
        if s >= 0:
            want[t] += (x[t].double() @ a[s].double().T) @ b[s].double().T
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[slot < 0], base[slot < 0])  # the base model's tokens untouched


def test_each_token_bitwise_the_same_in_any_batch(kernel_ops):
    x, a, b, slot, base = _case(width=48, n_in=576, n_out=960)
    slot[slot < 0] = 1
    full = _delta(kernel_ops, x, a, b, slot, base)
    for t in (0, 5, 36):  # alone
        assert torch.equal(
            _delta(kernel_ops, x[t : t + 1], a, b, slot[t : t + 1], base[t : t + 1]),
            full[t : t + 1],
        )
    perm = torch.randperm(
        len(x), generator=torch.Generator().manual_seed(1)
    )  # reordered, other neighbours
    assert torch.equal(_delta(kernel_ops, x[perm], a, b, slot[perm], base[perm]), full[perm])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(_delta(kernel_ops, x, a, b, slot, base), full)
    finally:
        torch.set_num_threads(threads)


def test_bad_arguments_name_what(kernel_ops):
    x, a, b, slot, base = _case()
    with pytest.raises(RuntimeError, match="slot 3 of token 0"):
        _delta(kernel_ops, x, a, b, torch.full_like(slot, 3), base)
    with pytest.raises(RuntimeError, match="float32"):
        _delta(kernel_ops, x.double(), a, b, slot, base)
    with pytest.raises(RuntimeError, match="shapes disagree"):
        _delta(kernel_ops, x[:, :99], a, b, slot, base)
