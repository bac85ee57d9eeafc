"""The int4 KV cache (--kv-cache-dtype int4): the native kv_store turns each K / V head row by the
normalized Hadamard matrix, rounds it to 4 bits (-8..7) with a scale per token and head chosen for
the least squared error, and the paged attention turns the queries the same way and its outputs
back. Checked against torch: the stored bytes are a torch rounding of the turned rows at the
kernel's scale, that scale is the best of its candidates, attention equals float attention over the
decoded (turned back) K / V, and the turn shrinks the error of a row with an outlier channel."""

from __future__ import annotations

import math

import pytest
import torch

from radixlm.cache.memory_pool import INT4_KV, TokenToKVPool


def hadamard(d: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def decode(buf: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[n, heads, d / 2] bytes + [n, heads] scales -> the turned rows [n, heads, d]."""
    lo, hi = (buf & 15).to(torch.int32), (buf >> 4).to(torch.int32)
    lo, hi = lo - 16 * (lo > 7), hi - 16 * (hi > 7)  # two's complement nibbles
    q = torch.stack([lo, hi], -1).reshape(*buf.shape[:-1], 2 * buf.shape[-1]).float()
    return q * scale[..., None]


def store(kernel_ops, k, v):
    t, h, d = k.shape
    kb = torch.zeros(t + 1, h, d // 2, dtype=INT4_KV)
    vb, ks, vs = torch.zeros_like(kb), torch.zeros(t + 1, h), torch.zeros(t + 1, h)
    kernel_ops.kv_store_(k, v, torch.arange(1, t + 1), kb, vb, ks, vs)
    return kb, vb, ks, vs


def causal_attention(q, k, v, scale):
    """Float attention, every query over the keys up to its own position (GQA by repetition)."""
    t, hq, _ = q.shape
    g = hq // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v)


# kv_store.cpp's i4_scale candidates: the largest-magnitude value at -8, then shrunk by each.
SHRINK = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65)


def round_i4(turned: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The rows rounded to -8..7 steps of `scale` [..., 1], back in float."""
    return (turned / scale).round().clamp(-8, 7) * scale


@pytest.mark.parametrize("d", [64, 128])
def test_store_rounds_the_turned_rows_at_the_best_candidate_scale(kernel_ops, d):
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(37, 2, d, generator=g), torch.randn(37, 2, d, generator=g)
    k[:5, 0, 3] *= 30  # rows with an outlier channel
    kb, vb, ks, vs = store(kernel_ops, k, v)
    for x, buf, sc in ((k, kb, ks), (v, vb, vs)):
        turned = x @ hadamard(d)
        got = decode(buf[1:], sc[1:])
        # the bytes are the turned rows rounded at the kernel's own scale
        assert torch.allclose(got, round_i4(turned, sc[1:, :, None]), rtol=1e-6, atol=1e-6)
        # the scale is the best candidate: no candidate rounds these rows with less error
        idx = turned.abs().argmax(-1, keepdim=True)
        base = turned.gather(-1, idx) / -8
        errs = torch.stack(
            [((round_i4(turned, base * f) - turned) ** 2).sum(-1) for f in SHRINK], -1
        )
        ours = ((got - turned) ** 2).sum(-1)
        assert (ours <= errs.min(-1).values * (1 + 1e-4) + 1e-9).all()
        assert torch.isclose(sc[1:, :, None] / base, torch.tensor(SHRINK), rtol=1e-5).any(-1).all()
        # and well below the plain max / 7 rounding it replaced (0.72x on the default model's K / V)
        plain = round_i4(turned, turned.abs().amax(-1, keepdim=True) / 7)
        assert ours.sum() < 0.85 * ((plain - turned) ** 2).sum()
    assert (kb[0] == 0).all() and (ks[0] == 0).all()  # slot 0 untouched


def test_the_turn_spreads_an_outlier_channel(kernel_ops):
    """A row whose channel 5 is 20x the others: rounded as it is, every other channel falls into
    the zero bin; turned first, the error is several times smaller."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(64, 1, 64, generator=g)
    k[:, :, 5] *= 20
    kb, _, ks, _ = store(kernel_ops, k, k.clone())
    turned_back = decode(kb[1:], ks[1:]) @ hadamard(64)
    naive_scale = k.abs().amax(-1, keepdim=True) / 7
    naive = (k / naive_scale).round().clamp(-7, 7) * naive_scale
    ours, plain = (turned_back - k).norm(), (naive - k).norm()
    assert ours < plain / 3, (ours, plain)


@pytest.mark.parametrize("hq,hkv", [(4, 2), (3, 3)])
def test_attention_is_float_attention_over_the_decoded_cache(kernel_ops, hq, hkv):
    g = torch.Generator().manual_seed(2)
    t, d = 45, 64
    k, v = torch.randn(t, hkv, d, generator=g), torch.randn(t, hkv, d, generator=g)
    q = torch.randn(t, hq, d, generator=g)
    kb, vb, ks, vs = store(kernel_ops, k, v)
    req_to_token = torch.arange(1, t + 1).view(1, t)
    scale = 1 / math.sqrt(d)
    out = kernel_ops.paged_attention(
        q, kb, vb, ks, vs, req_to_token, torch.tensor([0]), torch.tensor([t]),
        torch.tensor([0, t]), scale,
    )  # fmt: skip
    h = hadamard(d)
    kd, vd = decode(kb[1:], ks[1:]) @ h, decode(vb[1:], vs[1:]) @ h
    assert torch.allclose(out, causal_attention(q, kd, vd, scale), atol=2e-5)
    # and near float attention over the unrounded K / V (4 bits: ~10% per element)
    exact = causal_attention(q, k, v, scale)
    assert (out - exact).norm() / exact.norm() < 0.25


def test_pool_bytes_and_refusals():
    fp16 = TokenToKVPool.bytes_per_token(30, 3, 64, torch.float16)
    int4 = TokenToKVPool.bytes_per_token(30, 3, 64, INT4_KV)
    assert int4 == 30 * 3 * (64 + 2 * 4) and fp16 / int4 >= 3.5
    pool = TokenToKVPool(16, 2, 2, 64, dtype=INT4_KV)
    assert pool.k_buffer[0].shape == (17, 2, 32) and pool.get_kv_scales(0)[0].shape == (17, 2)
    with pytest.raises(ValueError, match=r"int4 needs a power-of-two head_dim .* head_dim \[80\]"):
        TokenToKVPool(16, 2, 2, 80, dtype=INT4_KV)


def test_mla_latent_pool_refuses_int4():
    from radixlm.cache.mla_pool import MLATokenToKVPool

    with pytest.raises(ValueError, match="kv_cache_dtype int4 is not supported with an MLA"):
        MLATokenToKVPool(16, 2, kv_lora_rank=32, qk_rope_head_dim=16, dtype=INT4_KV)
