"""Fused element-wise ops against the torch code they replace (layers' own fallbacks)."""

import pytest
import torch
import torch.nn.functional as F

from radixlm.model.layers.rotary import RotaryEmbedding

RTOL = 1e-5  # float32 reassociation only; a wrong index or formula is O(1)


def close(a, b, scale=None):
    scale = b.abs().max() if scale is None else scale
    return ((a - b).abs().max() / scale).item() < RTOL


@pytest.mark.parametrize("rows,cols", [(1, 576), (3, 64), (17, 100), (5, 7)])
def test_rmsnorm_and_add_rmsnorm(kernel_ops, rows, cols):
    g = torch.Generator().manual_seed(rows * cols)
    x, res, w = (
        torch.randn(rows, cols, generator=g) * 3,
        torch.randn(rows, cols, generator=g),
        torch.randn(cols, generator=g),
    )
    eps = 1e-5

    def ref(v):
        return w * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps))

    assert close(kernel_ops.rmsnorm(x, w, eps), ref(x))
    xs, rs = x.clone(), res.clone()
    kernel_ops.add_rmsnorm_(xs, rs, w, eps)
    assert torch.equal(rs, x + res)
    assert close(xs, ref(x + res))
    # A strided row view (a slice of a wider buffer) reads and writes only its own columns.
    wide = torch.randn(rows, cols + 9, generator=g)
    out = kernel_ops.rmsnorm(wide[:, 4 : 4 + cols], w, eps)
    assert close(out, ref(wide[:, 4 : 4 + cols]))


@pytest.mark.parametrize("rows,d", [(1, 1536), (4, 13), (9, 64)])
def test_silu_and_mul(kernel_ops, rows, d):
    g = torch.Generator().manual_seed(d)
    x = torch.randn(rows, 2 * d, generator=g) * 6
    x[0, :4] = torch.tensor([-100.0, -88.0, 80.0, 0.0])  # the exp clamps
    ref = F.silu(x[:, :d]) * x[:, d:]
    assert close(kernel_ops.silu_and_mul(x), ref, scale=ref.abs().max())


@pytest.mark.parametrize("head_dim,rot_factor", [(64, 1.0), (32, 0.5), (20, 1.0)])
def test_rotary_in_place_matches_torch(kernel_ops, head_dim, rot_factor):
    rope = RotaryEmbedding(
        head_dim,
        512,
        {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": rot_factor},
    )
    g = torch.Generator().manual_seed(head_dim)
    qkv = torch.randn(6, (4 + 2 + 2) * head_dim, generator=g)
    q, k, v = qkv.split([4 * head_dim, 2 * head_dim, 2 * head_dim], dim=-1)
    pos = torch.tensor([0, 1, 5, 511, 77, 3])
    ref_q, ref_k = (t.reshape(6, -1, head_dim) for t in (q.clone(), k.clone()))
    cos, sin = rope.cos_sin_cache[pos].unsqueeze(1).chunk(2, dim=-1)
    ref_q, ref_k = (rope._rotate(t.reshape(6, -1), cos, sin) for t in (ref_q, ref_k))
    v_before = v.clone()
    kernel_ops.rotary_embedding_(pos, q, k, head_dim, rope.cos_sin_cache)
    assert close(q, ref_q) and close(k, ref_k)
    assert torch.equal(v, v_before)  # the views' neighbours are untouched
    with pytest.raises(RuntimeError, match="beyond the cache"):
        kernel_ops.rotary_embedding_(torch.tensor([512] * 6), q, k, head_dim, rope.cos_sin_cache)


def test_layers_take_the_fused_path(kernel_ops, monkeypatch):
    """The model's layers call the fused ops on CPU float32 (and still equal their torch code)."""
    from radixlm.model.layers import activation, norm
    from radixlm.model.layers.norm import RMSNorm

    calls = []

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(kernel_ops, name)

    monkeypatch.setattr(norm, "fused_ops", lambda x: Spy())
    monkeypatch.setattr(activation, "fused_ops", lambda x: Spy())
    n = RMSNorm(8)
    x, r = torch.randn(2, 8), torch.randn(2, 8)
    out, res = n(x.clone(), r.clone())
    assert close(out, n._norm(x + r)) and torch.equal(res, x + r)
    activation.SiluAndMul()(torch.randn(2, 8))
    assert calls == ["add_rmsnorm_", "silu_and_mul"]
