"""Tree attention (a TARGET_VERIFY batch of draft trees, model/tree_mask.py) on the native and the
torch backends against an explicit dense masked softmax over the gathered K/V: random trees,
chains and plain requests side by side, ragged prefixes, slots scattered over the pool, GQA.
The native backend also gives each node bitwise what a decode step along its path gives."""

from __future__ import annotations

import random

import pytest
import torch

from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention.native import NativeCPUBackend
from radixlm.model.layers.attention.radix_attention import RadixAttention
from radixlm.model.layers.attention.torch_sdpa import TorchSDPABackend
from radixlm.model.tree_mask import NO_PARENT, TreeMask

HEADS, KV_HEADS, D = 4, 2, 16
POOL = 600


def random_parents(rng: random.Random, n: int, kind: str) -> list[int]:
    """The new tokens' parents: the root first, then a random tree (or a chain) below it."""
    if kind == "chain":
        return [NO_PARENT] + list(range(n - 1))
    return [NO_PARENT] + [rng.randrange(r) for r in range(1, n)]


def build_batch(seed: int, kv_dtype: torch.dtype):
    """Requests with ragged prefixes and random trees/chains over scattered slots; K/V random."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    kv = TokenToKVPool(POOL, 1, KV_HEADS, D, dtype=kv_dtype)
    r2t = ReqToTokenPool(160, 256)  # rows for the decode comparison too
    slots = torch.randperm(POOL, generator=gen)[: POOL - 20] + 1  # scattered, never slot 0
    kinds = ["tree", "chain", "tree", "tree", "one"][: rng.randrange(3, 6)]
    rng.shuffle(kinds)
    reqs, used = [], 0
    for _b, kind in enumerate(kinds):
        prefix = rng.randrange(1, 90)
        n = 1 if kind == "one" else rng.randrange(2, 24)
        row = r2t.alloc()
        r2t.req_to_token[row, : prefix + n] = slots[used : used + prefix + n]
        used += prefix + n
        reqs.append((row, prefix, random_parents(rng, n, kind)))
    k_all = torch.randn(POOL + 1, KV_HEADS, D, generator=gen)
    v_all = torch.randn(POOL + 1, KV_HEADS, D, generator=gen)
    k_buf, v_buf = kv.get_kv_buffer(0)
    k_buf.copy_(k_all.to(kv_dtype))
    v_buf.copy_(v_all.to(kv_dtype))
    tokens = sum(len(p) for _, _, p in reqs)
    q = torch.randn(tokens, HEADS, D, generator=gen)
    return kv, r2t, reqs, q


def forward_batch(kv, r2t, reqs, tree: bool) -> ForwardBatch:
    rows = [row for row, _, _ in reqs]
    seq_lens = [prefix + len(p) for _, prefix, p in reqs]
    positions, out_loc = [], []
    for (row, prefix, parents), seq_len in zip(reqs, seq_lens):
        depth = TreeMask.from_parents([parents], torch.device("cpu")).depths(0)
        positions += [prefix + d for d in depth]
        out_loc.append(r2t.req_to_token[row, prefix:seq_len])
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)
    return ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=len(reqs),
        input_ids=t([0] * len(positions)),
        positions=t(positions),
        req_pool_indices=t(rows),
        seq_lens=t(seq_lens),
        out_cache_loc=torch.cat(out_loc),
        req_to_token_pool=r2t,
        token_to_kv_pool=kv,
        seq_lens_cpu=seq_lens,
        extend_prefix_lens_cpu=[prefix for _, prefix, _ in reqs],
        extend_seq_lens_cpu=[len(p) for _, _, p in reqs],
        tree_mask=(
            TreeMask.from_parents([p for _, _, p in reqs], torch.device("cpu")) if tree else None
        ),
    )


def dense_reference(kv, r2t, reqs, q, scaling: float, window=None) -> torch.Tensor:
    """float64: each new token over its prefix plus its own ancestors and itself, by explicit
    gathering; under a window, keys within it by position (prefix + depth)."""
    k_buf, v_buf = (b.double() for b in kv.get_kv_buffer(0))
    out, t = torch.empty(q.shape, dtype=torch.float64), 0
    for row, prefix, parents in reqs:
        slots = r2t.req_to_token[row]
        depth = TreeMask.from_parents([parents], torch.device("cpu")).depths(0)
        for r in range(len(parents)):
            path, a = [], r
            while a != NO_PARENT:
                path.append(a)
                a = parents[a]
            cols = list(range(prefix)) + [prefix + c for c in sorted(path)]
            pos = list(range(prefix)) + [prefix + depth[c] for c in sorted(path)]
            if window is not None:
                cols = [c for c, p in zip(cols, pos) if p > prefix + depth[r] - window]
            keys = slots[torch.tensor(cols)]
            kk, vv = k_buf[keys], v_buf[keys]  # [L, kv_heads, D]
            for h in range(HEADS):
                g = h // (HEADS // KV_HEADS)
                s = (kk[:, g] @ q[t, h].double()) * scaling
                out[t, h] = torch.softmax(s, 0) @ vv[:, g]
            t += 1
    return out


def run(backend, kv, r2t, reqs, q, window=None) -> torch.Tensor:
    fb = forward_batch(kv, r2t, reqs, tree=True)
    fb.attn_backend = backend
    backend.init_forward_metadata(fb)
    backend.begin_forward(fb)
    layer = RadixAttention(HEADS, D, D**-0.5, KV_HEADS, 0, sliding_window_size=window)
    return backend.forward_extend(q, None, None, layer, fb)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [None, 7])
def test_native_tree_attention_equals_dense_reference(kernel_ops, seed, kv_dtype, window):
    kv, r2t, reqs, q = build_batch(seed, kv_dtype)
    assert any(not TreeMask.from_parents([p], torch.device("cpu")).is_causal(0) for _, _, p in reqs)
    got = run(NativeCPUBackend(), kv, r2t, reqs, q, window)
    torch.testing.assert_close(
        got.double(), dense_reference(kv, r2t, reqs, q, D**-0.5, window), atol=2e-5, rtol=1e-5
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("window", [None, 7])
def test_torch_tree_attention_equals_dense_reference(seed, window):
    kv, r2t, reqs, q = build_batch(seed, torch.float32)
    backend = TorchSDPABackend(sliding_window_size=window)
    got = run(backend, kv, r2t, reqs, q, window)
    ref = dense_reference(kv, r2t, reqs, q, D**-0.5, window)
    torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 7])
def test_native_tree_node_is_bitwise_its_decode_step(kernel_ops, window):
    """Each node's output equals, bit for bit, a DECODE batch whose request row holds the node's
    prefix and path at consecutive columns (what plain decoding along that path reads); under a
    window too (a node's key list index is its key's position)."""
    kv, r2t, reqs, q = build_batch(11, torch.float16)
    got = run(NativeCPUBackend(), kv, r2t, reqs, q, window)
    dec_rows, dec_lens = [], []
    for row, prefix, parents in reqs:
        slots = r2t.req_to_token[row]
        for r in range(len(parents)):
            path, a = [], r
            while a != NO_PARENT:
                path.append(a)
                a = parents[a]
            new = r2t.alloc()
            keys = torch.cat([slots[:prefix], slots[prefix + torch.tensor(sorted(path))]])
            r2t.req_to_token[new, : len(keys)] = keys
            dec_rows.append(new)
            dec_lens.append(len(keys))
    n = len(dec_rows)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=n,
        input_ids=t([0] * n),
        positions=t(dec_lens) - 1,
        req_pool_indices=t(dec_rows),
        seq_lens=t(dec_lens),
        out_cache_loc=t([0] * n),
        req_to_token_pool=r2t,
        token_to_kv_pool=kv,
        seq_lens_cpu=dec_lens,
    )
    backend = NativeCPUBackend()
    fb.attn_backend = backend
    backend.init_forward_metadata(fb)
    layer = RadixAttention(HEADS, D, D**-0.5, KV_HEADS, 0, sliding_window_size=window)
    decoded = backend.forward_decode(q, None, None, layer, fb)
    assert n == q.shape[0] and torch.equal(decoded, got)
