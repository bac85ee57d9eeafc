"""The native paged attention and KV store against SDPA over the same K/V, every KV dtype, random
slot layouts; and its batch invariance (a query's output is bitwise the same however the batch is
cut), which the quantized path relies on."""

import pytest
import torch
import torch.nn.functional as F

from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8]
RTOL = 2e-5  # float32 reassociation only (online softmax in blocks vs SDPA)


class Layout:
    """A KV pool with requests at random, scattered slots (one layer)."""

    def __init__(self, lens, kvh, d, dtype, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.kvh, self.d = kvh, d
        total = sum(lens)
        self.pool = TokenToKVPool(total + 50, 1, kvh, d, dtype)
        self.req_pool = ReqToTokenPool(len(lens) + 3, max(lens) + 8)
        slots = torch.randperm(total + 50, generator=self.g)[:total] + 1  # never the dummy slot 0
        self.rows, self.lens, self.k, self.v = [], list(lens), [], []
        off = 0
        for n in lens:
            row = self.req_pool.alloc()
            self.req_pool.req_to_token[row, :n] = slots[off : off + n]
            k = torch.randn(n, kvh, d, generator=self.g) * 2
            v = torch.randn(n, kvh, d, generator=self.g)
            self.pool.set_kv_buffer(0, slots[off : off + n], k, v)
            self.rows.append(row)
            self.k.append(k)
            self.v.append(v)
            off += n

    def stored(self, i):
        """Request i's K/V as the pool holds them, back in float32."""
        kb, vb = self.pool.get_kv_buffer(0)
        ks, vs = self.pool.get_kv_scales(0)
        idx = self.req_pool.req_to_token[self.rows[i], : self.lens[i]]
        if ks is None:
            return kb[idx].float(), vb[idx].float()
        return kb[idx].float() * ks[idx][..., None], vb[idx].float() * vs[idx][..., None]

    def run(self, ops, q, reqs, q_lens, scale):
        """reqs: request indices; q_lens: queries of each (the last ones of its sequence)."""
        q_start = torch.zeros(len(reqs) + 1, dtype=torch.int64)
        q_start[1:] = torch.tensor(q_lens).cumsum(0)
        kb, vb = self.pool.get_kv_buffer(0)
        ks, vs = self.pool.get_kv_scales(0)
        return ops.paged_attention(
            q,
            kb,
            vb,
            ks,
            vs,
            self.req_pool.req_to_token,
            torch.tensor([self.rows[i] for i in reqs]),
            torch.tensor([self.lens[i] for i in reqs]),
            q_start,
            scale,
        )


def sdpa_ref(q, k, v, scale):
    """q [n, Hq, D] are the last n positions of a sequence with k/v [L, kvh, D]."""
    n, L = q.shape[0], k.shape[0]
    mask = torch.arange(L)[None, :] <= torch.arange(L - n, L)[:, None]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None].double(),
        k.transpose(0, 1)[None].double(),
        v.transpose(0, 1)[None].double(),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return o[0].transpose(0, 1).float()


def check_against_sdpa(lay, out, q, q_lens, scale, alone_ops=None) -> None:
    """Each request's rows of `out` against SDPA over its stored K/V (relative error < RTOL); with
    alone_ops, also bitwise equal to the kernel run on that request alone."""
    off = 0
    for i, n in enumerate(q_lens):
        k, v = lay.stored(i)
        ref = sdpa_ref(q[off : off + n], k, v, scale)
        err = ((out[off : off + n] - ref).abs().max() / ref.abs().max()).item()
        assert err < RTOL, (
            f"request {i} ({lay.lens[i]} keys, {n} queries): relative error {err:.2e}"
        )
        if alone_ops is not None:
            alone = lay.run(alone_ops, q[off : off + n].clone(), [i], [n], scale)
            assert torch.equal(alone, out[off : off + n]), f"request {i} differs beside the others"
        off += n


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kvh,g,d", [(3, 3, 64), (2, 1, 128), (1, 4, 16), (1, 2, 512)])
def test_paged_attention_matches_sdpa(kernel_ops, dtype, kvh, g, d):
    lens = [1, 7, 33, 64, 95, 200]
    lay = Layout(lens, kvh, d, dtype, seed=kvh * 100 + d)
    q_lens = [1, 7, 5, 64, 1, 37]  # whole prompts, chunks after a prefix, decode steps
    q = torch.randn(sum(q_lens), kvh * g, d, generator=lay.g)
    scale = d**-0.5
    out = lay.run(kernel_ops, q, list(range(len(lens))), q_lens, scale)
    check_against_sdpa(lay, out, q, q_lens, scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kv_store_converts_like_torch(kernel_ops, dtype):
    lay = Layout([40], 3, 64, dtype, seed=3)
    kb, vb = lay.pool.get_kv_buffer(0)
    idx = lay.req_pool.req_to_token[lay.rows[0], :40]
    if dtype != torch.int8:
        assert torch.equal(kb[idx], lay.k[0].to(dtype)) and torch.equal(vb[idx], lay.v[0].to(dtype))
        return
    ks, _ = lay.pool.get_kv_scales(0)
    amax = lay.k[0].abs().amax(-1)
    assert torch.equal(ks[idx], amax / 127)
    expect = torch.round(lay.k[0] * (127 / amax)[..., None]).to(
        torch.int8
    )  # half to even, like the kernel
    assert torch.equal(kb[idx], expect)


def test_paged_attention_is_batch_invariant(kernel_ops):
    """The last query of a 150-token sequence: one extend, chunks of any size, a decode step, and
    beside other requests, all bitwise equal."""
    lay = Layout([150, 90, 13], 3, 64, torch.float32, seed=7)
    q_all = torch.randn(150, 9, 64, generator=lay.g)
    scale = 0.125
    full = lay.run(kernel_ops, q_all, [0], [150], scale)
    for n in (1, 2, 31, 32, 33, 100):
        part = lay.run(kernel_ops, q_all[-n:].clone(), [0], [n], scale)
        assert torch.equal(part, full[-n:]), f"chunk of {n} differs"
    other = torch.randn(5, 9, 64, generator=lay.g)
    mixed = lay.run(
        kernel_ops, torch.cat([other[:4], q_all[-3:], other[4:]]), [1, 0, 2], [4, 3, 1], scale
    )
    assert torch.equal(mixed[4:7], full[-3:])


def test_paged_attention_bad_input(kernel_ops):
    lay = Layout([10], 1, 16, torch.float32, seed=1)
    q = torch.randn(10, 2, 16)
    with pytest.raises(RuntimeError, match="queries over"):
        lay.run(kernel_ops, torch.randn(11, 2, 16), [0], [11], 0.25)
    lay.req_pool.req_to_token[lay.rows[0], 3] = 10**6
    with pytest.raises(RuntimeError, match="out of range"):
        lay.run(kernel_ops, q, [0], [10], 0.25)
    with pytest.raises(RuntimeError, match="head_dim"):
        kb, vb = lay.pool.get_kv_buffer(0)
        kernel_ops.paged_attention(
            torch.randn(1, 2, 8),
            kb,
            vb,
            None,
            None,
            lay.req_pool.req_to_token,
            torch.tensor([lay.rows[0]]),
            torch.tensor([10]),
            torch.tensor([0, 1]),
            0.25,
        )


class SharedLayout(Layout):
    """Requests whose rows start with the same slots, as after radix-cache hits: request i holds the
    first prefixes[i] slots of one shared chain, then tails[i] slots of its own."""

    def __init__(self, prefixes, tails, kvh, d, dtype, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.kvh, self.d = kvh, d
        chain = max(prefixes)
        total = chain + sum(tails)
        self.pool = TokenToKVPool(total + 50, 1, kvh, d, dtype)
        # The chain takes the lowest slots, so a request with a longer share of it sorts before one
        # that branches off earlier: units start deep and then take in shallower requests.
        perm = torch.randperm(total + 50, generator=self.g) + 1
        slots = torch.cat(
            [perm[perm <= chain + 25][:chain], perm[perm > chain + 25][: total - chain]]
        )
        k = torch.randn(total, kvh, d, generator=self.g) * 2
        v = torch.randn(total, kvh, d, generator=self.g)
        self.pool.set_kv_buffer(0, slots, k, v)
        self.lens = [p + t for p, t in zip(prefixes, tails)]
        self.req_pool = ReqToTokenPool(len(tails) + 3, max(self.lens) + 8)
        self.rows = []
        off = chain
        for p, t in zip(prefixes, tails):
            row = self.req_pool.alloc()
            self.req_pool.req_to_token[row, : p + t] = torch.cat([slots[:p], slots[off : off + t]])
            self.rows.append(row)
            off += t


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention_shared_prefixes(kernel_ops, dtype):
    """Requests sharing cached prefixes of different lengths (K/V read once per group of queries)
    match SDPA, and each request's output is bitwise what it gets alone."""
    prefixes = [
        270,
        200,
        270,
        40,
        200,
        270,
        0,
        200,
        100,
        270,
        31,
        270,
        200,
        256,
        224,
        256,
        224,
        230,
        256,
    ]
    tails = [1, 5, 40, 1, 33, 2, 20, 64, 10, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    # decode steps; extends, one from inside the prefix
    q_lens = [1, 5, 40, 1, 3, 2, 20, 64, 60, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    lay = SharedLayout(prefixes, tails, 3, 64, dtype, seed=11)
    q = torch.randn(sum(q_lens), 9, 64, generator=lay.g)
    scale = 0.125
    out = lay.run(kernel_ops, q, list(range(len(tails))), q_lens, scale)
    check_against_sdpa(lay, out, q, q_lens, scale, alone_ops=kernel_ops)
