"""The paged attention kernels (kernels/triton_ops/extend_attention.py, decode_attention.py) against
a float32 loop reference: random slot layouts (a request's K/V scattered over the pool), ragged
lengths, prefixes shared by slot (decode's group pass), GQA ratios 1, 3 and 8, float32 / float16 /
bfloat16 inputs, sliding windows, logit soft-caps, attention sinks and a tree mask."""

from __future__ import annotations

import pytest
import torch

from tests.triton.conftest import DTYPES, assert_close, requires_triton

pytestmark = requires_triton

GQA = [(2, 2), (6, 2), (8, 1)]  # (query heads, KV heads): ratios 1, 3, 8
D = 32
SCALE = D**-0.5


def reference(q, k, v, q_pos, window=None, cap=0.0, mask=None, sinks=None):
    """q [n, H, D] at positions q_pos over k/v [L, KVH, D] (positions 0..L-1), causal, in float32.
    mask [n, L] (True: attend) replaces causality where given. sinks [H]: HF gpt-oss's, a logit
    column per head joined to the scores before the softmax and dropped after it."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.float().repeat_interleave(heads // kv_heads, 1)
    v = v.float().repeat_interleave(heads // kv_heads, 1)
    s = torch.einsum("nhd,lhd->hnl", q.float(), k) * SCALE
    if cap:
        s = torch.tanh(s / cap) * cap
    k_pos = torch.arange(k.shape[0])
    visible = k_pos[None, :] <= q_pos[:, None] if mask is None else mask
    if window is not None:
        visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
    s = s.masked_fill(~visible[None], float("-inf"))
    if sinks is None:
        return torch.einsum("hnl,lhd->nhd", s.softmax(-1), v)
    sink = sinks.float().view(-1, 1, 1).expand(-1, s.shape[1], 1)
    return torch.einsum("hnl,lhd->nhd", torch.cat([s, sink], -1).softmax(-1)[..., :-1], v)


class Pool:
    """K/V buffers of `size` slots and slot rows handing each request scattered slots."""

    def __init__(self, device, dtype, kv_heads, size=600, width=160, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.k = torch.randn(size, kv_heads, D, generator=g).to(dtype).to(device)
        self.v = torch.randn(size, kv_heads, D, generator=g).to(dtype).to(device)
        self.free = (torch.randperm(size - 1, generator=g) + 1).tolist()  # slot 0: the pool's dummy
        self.width, self.device, self.g = width, device, g

    def rows(self, lens, shared=()):
        """Slot rows [bs, width]; shared: (request, of_request, n): its first n slots are the
        other's."""
        rows = torch.zeros(len(lens), self.width, dtype=torch.int64)
        for b, n in enumerate(lens):
            rows[b, :n] = torch.tensor([self.free.pop() for _ in range(n)])
        for b, other, n in shared:
            rows[b, :n] = rows[other, :n]
        return rows.to(self.device)

    def q(self, n, heads, dtype):
        return torch.randn(n, heads, D, generator=self.g).to(dtype).to(self.device)


def run_extend(pool, q, rows, prefix, ext, **kw):
    from radixlm.kernels.triton_ops.extend_attention import extend_attention

    as_t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=q.device)
    starts = [sum(ext[:i]) for i in range(len(ext))]
    out = torch.empty_like(q)
    extend_attention(
        q, pool.k, pool.v, out, rows, as_t(starts), as_t(prefix), as_t(ext), max(ext), SCALE, **kw
    )
    return out, starts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", GQA)
def test_extend_over_a_prefix_in_the_pool(triton_device, dtype, heads, kv_heads):
    pool = Pool(triton_device, dtype, kv_heads)
    prefix, ext = [0, 37, 5, 19], [21, 1, 40, 3]  # a fresh prompt, a decode-like row, a long extend
    rows = pool.rows([p + e for p, e in zip(prefix, ext)])
    q = pool.q(sum(ext), heads, dtype)
    out, starts = run_extend(pool, q, rows, prefix, ext)
    for b, (p, e, s) in enumerate(zip(prefix, ext, starts)):
        slots = rows[b, : p + e]
        ref = reference(
            q[s : s + e].cpu(), pool.k[slots].cpu(), pool.v[slots].cpu(), torch.arange(p, p + e)
        )
        assert_close(out[s : s + e].cpu(), ref, dtype, f"request {b}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,cap", [(7, 0.0), (None, 3.0), (12, 2.5)])
def test_extend_window_and_logit_cap(triton_device, dtype, window, cap):
    pool = Pool(triton_device, dtype, 2, seed=1)
    prefix, ext = [30, 0], [18, 25]
    rows = pool.rows([p + e for p, e in zip(prefix, ext)])
    q = pool.q(sum(ext), 6, dtype)
    out, starts = run_extend(pool, q, rows, prefix, ext, logit_cap=cap, window=window)
    for b, (p, e, s) in enumerate(zip(prefix, ext, starts)):
        slots = rows[b, : p + e]
        ref = reference(
            q[s : s + e].cpu(),
            pool.k[slots].cpu(),
            pool.v[slots].cpu(),
            torch.arange(p, p + e),
            window=window,
            cap=cap,
        )
        assert_close(out[s : s + e].cpu(), ref, dtype, f"request {b}")


def sinks_of(heads: int, device) -> torch.Tensor:
    """Sinks of a visible weight: logits around the scores' own (N(0, 1) times 2)."""
    g = torch.Generator().manual_seed(9)
    return (2 * torch.randn(heads, generator=g)).to(device)


@pytest.mark.parametrize("dtype,window", [(torch.float32, None), (torch.bfloat16, 7)])
def test_extend_attention_sinks(triton_device, dtype, window):
    """gpt-oss's sinks (float32 whatever the dtype), on full and windowed layers, over a prefix."""
    pool = Pool(triton_device, dtype, 2, seed=6)
    prefix, ext = [30, 0, 3], [18, 25, 1]
    rows = pool.rows([p + e for p, e in zip(prefix, ext)])
    q = pool.q(sum(ext), 6, dtype)
    sinks = sinks_of(6, triton_device)
    out, starts = run_extend(pool, q, rows, prefix, ext, window=window, sinks=sinks)
    for b, (p, e, s) in enumerate(zip(prefix, ext, starts)):
        slots = rows[b, : p + e]
        ref = reference(
            q[s : s + e].cpu(),
            pool.k[slots].cpu(),
            pool.v[slots].cpu(),
            torch.arange(p, p + e),
            window=window,
            sinks=sinks.cpu(),
        )
        assert_close(out[s : s + e].cpu(), ref, dtype, f"request {b}")
    plain, _ = run_extend(pool, q, rows, prefix, ext, window=window)
    assert (plain - out).abs().max() > 1e-2, "the sinks changed nothing"


def test_extend_tree_mask(triton_device):
    """TARGET_VERIFY of a draft tree: each new token sees the prefix and its ancestors in the
    tree."""
    dtype = torch.float32
    pool = Pool(triton_device, dtype, 2, seed=2)
    prefix, ext = [12, 20], [5, 4]
    parents = [[-1, 0, 0, 1, 2], [-1, 0, 1, 1]]  # node i's parent among the new tokens
    masks, flat = [], []
    for par in parents:
        m = torch.zeros(len(par), len(par), dtype=torch.bool)
        for i in range(len(par)):
            j = i
            while j >= 0:
                m[i, j] = True
                j = par[j]
        masks.append(m)
        flat.append(m.reshape(-1))
    custom = torch.cat(flat).to(torch.uint8).to(triton_device)
    mask_start = torch.tensor([0, ext[0] ** 2], dtype=torch.int64, device=triton_device)
    rows = pool.rows([p + e for p, e in zip(prefix, ext)])
    q = pool.q(sum(ext), 6, dtype)
    out, starts = run_extend(pool, q, rows, prefix, ext, custom_mask=custom, mask_start=mask_start)
    for b, (p, e, s) in enumerate(zip(prefix, ext, starts)):
        slots = rows[b, : p + e]
        full = torch.cat((torch.ones(e, p, dtype=torch.bool), masks[b]), 1)
        ref = reference(
            q[s : s + e].cpu(),
            pool.k[slots].cpu(),
            pool.v[slots].cpu(),
            torch.arange(p, p + e),
            mask=full,
        )
        assert_close(out[s : s + e].cpu(), ref, dtype, f"request {b}")


def run_decode(pool, q, rows, lens, groups=True, splits=3, **kw):
    from radixlm.kernels.triton_ops.decode_attention import decode_attention
    from radixlm.kernels.triton_ops.prefix_groups import find_prefix_groups

    seq_lens = torch.tensor(lens, dtype=torch.int64, device=q.device)
    prefix = find_prefix_groups(rows, seq_lens) if groups else None
    kv_start = prefix.kv_start if groups else torch.zeros_like(seq_lens)
    out = torch.empty_like(q)
    decode_attention(
        q,
        pool.k,
        pool.v,
        out,
        rows,
        seq_lens,
        kv_start,
        splits,
        SCALE,
        prefix=prefix,
        num_prefix_splits=2,
        **kw,
    )
    return out, prefix


def check_decode(pool, q, out, rows, lens, dtype, **kw):
    for b, n in enumerate(lens):
        slots = rows[b, :n]
        ref = reference(
            q[b : b + 1].cpu(),
            pool.k[slots].cpu(),
            pool.v[slots].cpu(),
            torch.tensor([n - 1]),
            **kw,
        )
        assert_close(out[b : b + 1].cpu(), ref, dtype, f"request {b}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads", GQA)
def test_decode_split_kv_with_shared_prefixes(triton_device, dtype, heads, kv_heads):
    """Requests 0, 2 and 4 share 34 slots (2 shares 40 with 0), 1 and 5 share 35 (5 holds one token
    of its own), 3 and 6 share 10 (under MIN_SHARED_LEN: no pass)."""
    pool = Pool(triton_device, dtype, kv_heads, seed=3)
    lens = [45, 50, 43, 17, 36, 36, 70]
    rows = pool.rows(lens, shared=[(2, 0, 40), (4, 0, 34), (5, 1, 35), (3, 6, 10)])
    q = pool.q(len(lens), heads, dtype)
    out, groups = run_decode(pool, q, rows, lens)
    assert groups.kv_start.tolist() == [34, 35, 34, 0, 34, 35, 0]
    check_decode(pool, q, out, rows, lens, dtype)
    plain, _ = run_decode(pool, q, rows, lens, groups=False, splits=1)
    check_decode(pool, q, plain, rows, lens, dtype)


@pytest.mark.parametrize("window,cap", [(9, 0.0), (None, 4.0)])
def test_decode_window_and_logit_cap(triton_device, window, cap):
    dtype = torch.float16
    pool = Pool(triton_device, dtype, 2, seed=4)
    lens = [5, 30, 61]
    rows = pool.rows(lens)
    q = pool.q(len(lens), 6, dtype)
    out, _ = run_decode(pool, q, rows, lens, groups=False, window=window, logit_cap=cap)
    check_decode(pool, q, out, rows, lens, dtype, window=window, cap=cap)


@pytest.mark.parametrize("window,groups", [(None, True), (9, False)])
def test_decode_attention_sinks(triton_device, window, groups):
    """Sinks join the merged denominator: with several splits, with the shared-prefix pass (its
    partials merged before the sink) and on a windowed layer."""
    dtype = torch.float32
    pool = Pool(triton_device, dtype, 2, seed=7)
    lens = [5, 40, 61, 45]
    rows = pool.rows(lens, shared=[(3, 1, 36)] if groups else ())
    q = pool.q(len(lens), 6, dtype)
    sinks = sinks_of(6, triton_device)
    out, _ = run_decode(pool, q, rows, lens, groups=groups, window=window, sinks=sinks)
    check_decode(pool, q, out, rows, lens, dtype, window=window, sinks=sinks.cpu())


def test_prefix_groups_follow_the_cpu_rule(triton_device):
    """The device-side grouping finds what shared_prefix.py finds on the host: groups by first slot,
    the common run capped so every member keeps its newest token, none under MIN_SHARED_LEN."""
    from radixlm.kernels.triton_ops.prefix_groups import find_prefix_groups
    from radixlm.model.layers.attention.shared_prefix import build_shared_prefix_metadata

    pool = Pool(triton_device, torch.float32, 1, seed=5)
    lens = [40, 40, 33, 60, 60, 3, 3]
    rows = pool.rows(lens, shared=[(1, 0, 40), (2, 0, 33), (4, 3, 31), (6, 5, 3)])
    groups = find_prefix_groups(rows, torch.tensor(lens, device=triton_device))
    host = build_shared_prefix_metadata(rows.cpu(), lens)
    assert host.query_map.tolist() == [[0, 1, 2]] and int((host.prefix_mask == 0).sum()) == 32
    assert groups.kv_start.tolist() == [32, 32, 32, 0, 0, 0, 0]
