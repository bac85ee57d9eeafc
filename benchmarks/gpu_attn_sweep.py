"""Split-KV decode attention on a GPU: the Triton kernel's time and effective bandwidth at the
Llama-3-8B shape (32 query heads, 8 KV heads, head_dim 128, bf16 KV at scattered slots), for the
backend's default launch and a sweep of (splits, BLOCK_N, num_warps, num_stages), each checked
against a float32 reference. The KV bytes a step must read over the time is the figure to push
towards the copy rate (docs/gpu.md).

    python benchmarks/gpu_attn_sweep.py --batch-size 64 --context 288 2048
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch


def copy_rate(device) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), 1 GiB."""
    x = torch.empty(1 << 29, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    return 2 * x.numel() * 2 / time_it(lambda: y.copy_(x), 10)


def time_it(fn, iters: int = 20) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def reference(q, k_buf, v_buf, kv_slots, scale):
    k = k_buf[kv_slots].float()  # [bs, n, kvh, d]
    v = v_buf[kv_slots].float()
    group = q.shape[1] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bhd,bnhd->bhn", q.float(), k) * scale
    return torch.einsum("bhn,bnhd->bhd", torch.softmax(s, dim=-1), v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, nargs="+", default=[64])
    p.add_argument("--context", type=int, nargs="+", default=[288, 2048])
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--output", default=None, help="append one JSON line per configuration")
    args = p.parse_args()

    from radixlm.kernels import triton_ops
    from radixlm.kernels.triton_ops.decode_attention import decode_attention
    from radixlm.kernels.triton_ops.prefix_groups import find_prefix_groups

    dev = torch.device("cuda")
    rate = copy_rate(dev)
    sms = triton_ops.sm_count(dev)
    print(f"{torch.cuda.get_device_name()}: copy {rate / 1e9:.0f} GB/s, {sms} SMs")
    g = torch.Generator(device=dev).manual_seed(0)
    for bs, ctx in itertools.product(args.batch_size, args.context):
        slots = bs * ctx + 1
        k_buf = torch.randn(
            slots, args.kv_heads, args.head_dim, device=dev, dtype=torch.bfloat16, generator=g
        )
        v_buf = torch.randn_like(k_buf)
        kv_slots = (torch.randperm(slots - 1, device=dev, generator=g) + 1).view(bs, ctx)
        seq_lens = torch.full((bs,), ctx, dtype=torch.int64, device=dev)
        kv_start = torch.zeros(bs, dtype=torch.int64, device=dev)
        q = torch.randn(
            bs, args.heads, args.head_dim, device=dev, dtype=torch.bfloat16, generator=g
        )
        out = torch.empty_like(q)
        scale = args.head_dim**-0.5
        ref = reference(q, k_buf, v_buf, kv_slots, scale)
        kv_bytes = 2 * bs * ctx * args.kv_heads * args.head_dim * 2
        default_splits = triton_ops.decode_splits(bs, args.kv_heads, sms)
        prefix_splits = triton_ops.decode_splits(1, args.kv_heads, sms)

        def run(name, fn):
            fn()
            err = (out.float() - ref).abs().max().item()
            t = time_it(fn)
            row = {
                "bs": bs,
                "context": ctx,
                "config": name,
                "us": round(t * 1e6, 1),
                "GB/s": round(kv_bytes / t / 1e9),
                "of_copy": round(kv_bytes / t / rate, 3),
                "max_err": err,
            }
            print(
                f"bs {bs:4d} ctx {ctx:5d} {name:44s} {row['us']:8.1f} us {row['GB/s']:6d} GB/s "
                f"{100 * row['of_copy']:5.1f}% of copy  err {err:.2e}"
                + ("  WRONG" if err > 5e-2 else "")
            )
            if args.output:
                with open(args.output, "a") as f:
                    f.write(json.dumps(row) + "\n")
            return t

        # As the backend launches it: groups searched every step (none here), default blocks.
        def backend():
            groups = find_prefix_groups(kv_slots, seq_lens)
            decode_attention(
                q,
                k_buf,
                v_buf,
                out,
                kv_slots,
                seq_lens,
                groups.kv_start,
                default_splits,
                scale,
                prefix=groups,
                num_prefix_splits=prefix_splits,
            )

        run(f"backend (splits {default_splits}, groups pass)", backend)
        best = None
        for splits, bn, warps, stages in itertools.product(
            (1, 2, 4, 8, 16), (32, 64, 128), (4, 8), (2, 3)
        ):
            name = f"splits {splits:2d} BLOCK_N {bn:3d} warps {warps} stages {stages}"

            def fn(splits=splits, bn=bn, warps=warps, stages=stages):
                decode_attention(
                    q,
                    k_buf,
                    v_buf,
                    out,
                    kv_slots,
                    seq_lens,
                    kv_start,
                    splits,
                    scale,
                    block_n=bn,
                    num_warps=warps,
                    num_stages=stages,
                )

            try:
                t = run(name, fn)
            except Exception as e:
                print(
                    f"bs {bs:4d} ctx {ctx:5d} {name:44s} failed: {type(e).__name__}: {str(e)[:80]}"
                )
                continue
            if best is None or t < best[0]:
                best = (t, name)
        print(
            f"best bs {bs} ctx {ctx}: {best[1]}: {best[0] * 1e6:.1f} us,"
            f" {kv_bytes / best[0] / rate:.1%} of copy"
        )


if __name__ == "__main__":
    main()
