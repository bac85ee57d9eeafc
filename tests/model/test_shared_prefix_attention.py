"""Shared-prefix (cascade) decode attention equals plain attention over each request's KV."""

import random

import pytest
import torch
import torch.nn.functional as F

from radixlm.model.layers.attention import shared_prefix
from radixlm.model.layers.attention.decode_path import gather_kv
from radixlm.model.layers.attention.shared_prefix import (
    build_shared_prefix_metadata,
    shared_prefix_decode,
)


def reference(q, k_buf, v_buf, rows, seq_lens, scale):
    out = []
    for b, n in enumerate(seq_lens):
        k = k_buf[rows[b, :n]].transpose(0, 1).unsqueeze(0)
        v = v_buf[rows[b, :n]].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(
            q[b : b + 1].unsqueeze(2), k, v, scale=scale, enable_gqa=True
        )
        out.append(o[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("cpu_flash", [True, False], ids=["cpu-flash", "generic"])
@pytest.mark.parametrize("seed", range(4))
def test_matches_per_request_attention(seed, cpu_flash, monkeypatch):
    # generic: the matmul path other devices take, run here on the CPU
    monkeypatch.setattr(shared_prefix, "_cpu_flash", lambda q: cpu_flash)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    heads, kvh, d, slots = 9, 3, 16, 4000
    k_buf, v_buf = torch.randn(slots, kvh, d), torch.randn(slots, kvh, d)
    free = list(range(slots))
    rng.shuffle(free)
    # Groups that share prefixes of several lengths (some too short to count), nested prefixes,
    # and loners; every request then has its own tail.
    prefixes = [[free.pop() for _ in range(n)] for n in (200, 64, 31, 120)]
    prefixes.append(prefixes[0][:90])  # shares 90 slots with group 0's prefix
    rows_list = []
    for i in range(14):
        pre = prefixes[i % len(prefixes)] if i < 11 else []
        rows_list.append(pre + [free.pop() for _ in range(rng.randrange(1, 40))])
    seq_lens = [len(r) for r in rows_list]
    width = max(seq_lens) + 5
    rows = torch.zeros((len(rows_list), width), dtype=torch.int64)
    for b, r in enumerate(rows_list):
        rows[b, : len(r)] = torch.tensor(r)
        rows[b, len(r) :] = torch.tensor(
            [free[j] for j in range(width - len(r))]
        )  # stale slots past the end
    meta = build_shared_prefix_metadata(rows, seq_lens)
    assert meta is not None and meta.prefix_indices.shape[0] >= 2
    q = torch.randn(len(rows_list), heads, d)
    want = reference(q, k_buf, v_buf, rows, seq_lens, 0.125)
    got = shared_prefix_decode(q, k_buf, v_buf, meta, 0.125, gather_kv)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5), (got - want).abs().max()
    # The prefixes' K/V as kept across steps (head-major copies) give the same.
    kept = shared_prefix.gather_prefix_kv(k_buf, v_buf, meta, gather_kv, contiguous=True)
    got = shared_prefix_decode(q, k_buf, v_buf, meta, 0.125, gather_kv, kept)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5), (got - want).abs().max()


def test_no_groups_means_no_metadata():
    rows = torch.arange(300).view(3, 100)
    assert build_shared_prefix_metadata(rows, [100, 100, 100]) is None
    shared = rows.clone()
    shared[1, :20] = shared[0, :20]  # 20 shared slots: below the threshold
    assert build_shared_prefix_metadata(shared, [100, 100, 100]) is None


def test_engine_greedy_with_shared_prefixes_matches_hf(tiny_engine, tiny_hf_model):
    """Requests decoding together over a cached shared prefix (so the shared-prefix path runs)
    give HF's greedy tokens (the session's plain engine, its cache flushed: tests/conftest.py)."""
    rng = random.Random(3)
    shared = [rng.randrange(3, 40000) for _ in range(120)]
    prompts = [
        shared + [rng.randrange(3, 40000) for _ in range(rng.randrange(1, 12))] for _ in range(6)
    ]
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    refs = []
    for p in prompts:
        out = tiny_hf_model.generate(
            torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        refs.append(out[0, len(p) :].tolist())
    e = tiny_engine
    e.generate(input_ids=shared, sampling_params={"max_new_tokens": 0})  # cache the prefix
    outs = e.generate(input_ids=prompts, sampling_params=sp)
    assert all(o["meta_info"]["cached_tokens"] >= 100 for o in outs)
    assert [o["output_ids"] for o in outs] == refs
