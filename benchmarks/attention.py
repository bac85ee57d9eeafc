"""The native paged attention alone, at a decode step's shape: B requests in G groups, each group
sharing a cached prefix, over every layer of a pool as large as the model's (so K/V come from
memory, not from the last level cache, as in serving).

    python benchmarks/attention.py [--groups 16 --per-group 2 --prefix 1024 --own 32] [--kv-dtype
    float16]

Prints the median time of one decode step's attention (all layers) and the K/V bytes it reads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import radixlm  # noqa: F401  (before torch: huge pages for torch's buffers)
from radixlm.cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.kernels.ops import ops


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--groups", type=int, default=16)
    p.add_argument(
        "--per-group", type=int, default=2, help="requests per group (sharing its prefix)"
    )
    p.add_argument("--prefix", type=int, default=1024, help="tokens of each group's shared prefix")
    p.add_argument("--own", type=int, default=32, help="tokens of each request after the prefix")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--group-size", type=int, default=3, help="query heads per KV head")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument(
        "--kv-dtype", default="float32", choices=["float32", "float16", "bfloat16", "int8"]
    )
    p.add_argument("--repeat", type=int, default=9)
    a = p.parse_args()
    torch.manual_seed(0)
    kernel = ops()
    bs = a.groups * a.per_group
    total = a.groups * a.prefix + bs * a.own
    pool = TokenToKVPool(total, a.layers, a.kv_heads, a.head_dim, getattr(torch, a.kv_dtype))
    rows = ReqToTokenPool(bs + 1, a.prefix + a.own + 1)
    slots = pool.alloc(total)  # consecutive, as a fresh pool hands them out
    k = torch.randn(total, a.kv_heads, a.head_dim)
    v = torch.randn(total, a.kv_heads, a.head_dim)
    for layer in range(a.layers):
        pool.set_kv_buffer(layer, slots, k, v)
    req_rows = []
    own = a.groups * a.prefix
    for g in range(a.groups):
        for _ in range(a.per_group):
            r = rows.alloc()
            req_rows.append(r)
            rows.req_to_token[r, : a.prefix] = slots[g * a.prefix : (g + 1) * a.prefix]
            rows.req_to_token[r, a.prefix : a.prefix + a.own] = slots[own : own + a.own]
            own += a.own
    q = torch.randn(bs, a.kv_heads * a.group_size, a.head_dim)
    index = (
        rows.req_to_token,
        torch.tensor(req_rows),
        torch.full((bs,), a.prefix + a.own),
        torch.arange(bs + 1),
        a.head_dim**-0.5,
    )

    def step() -> None:
        for layer in range(a.layers):
            kb, vb = pool.get_kv_buffer(layer)
            ks, vs = pool.get_kv_scales(layer)
            kernel.paged_attention(q, kb, vb, ks, vs, *index)

    for _ in range(3):
        step()
    times = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    per_layer = pool.total_bytes / (total + 1) / a.layers
    read = (a.groups * a.prefix + bs * a.own) * per_layer * a.layers  # each K/V row once
    ms = statistics.median(times) * 1e3
    print(
        f"{bs} requests in {a.groups} groups, {a.prefix} + {a.own} keys, {a.layers} layers,"
        f" {a.kv_dtype} KV: {ms:.1f} ms per decode step ({ms / a.layers:.2f} ms per layer); K/V"
        f" {read / 1e6:.0f} MB once = {read / ms / 1e6:.1f} GB/s"
    )


if __name__ == "__main__":
    main()
