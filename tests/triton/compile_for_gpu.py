"""Compile every Triton kernel for a Hopper GPU (sm_90) on a machine without one: the code
generation the interpreter skips (MLIR lowering, layouts, register and shared-memory allocation,
ptxas).

Each kernel wrapper of kernels/triton_ops runs as on a GPU (its GPU block sizes), on small CPU
tensors, with its kernels swapped for recorders: a launch records its arguments instead of running.
Each recorded launch is then compiled with triton.compile for GPUTarget("cuda", 90, 32), its
signature taken from the arguments (a tensor's dtype, an int's width). Run in a process without
TRITON_INTERPRET (tests/triton/test_compile_for_gpu.py starts one): python -m
tests.triton.compile_for_gpu
"""

from __future__ import annotations

import os
import sys
import time

import torch

TYPES = {
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.uint8: "*u8",
    torch.int8: "*i8",
    torch.bool: "*i1",
    torch.float8_e4m3fn: "*fp8e4nv",
}


class Recorder:
    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.kernel, args, kwargs))


def _type(value) -> str:
    if isinstance(value, torch.Tensor):
        return TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {value!r}")


def compile_call(kernel, args, kwargs):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    names = kernel.arg_names
    values = dict(zip(names, args))
    values.update({k: v for k, v in kwargs.items() if k in names})
    constexprs = {p.name for p in kernel.params if p.is_constexpr}
    signature = {n: "constexpr" if n in constexprs else _type(values[n]) for n in names}
    src = ASTSource(kernel, signature, {n: values[n] for n in names if n in constexprs})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def record_all(
    dtypes=(torch.bfloat16, torch.float16, torch.float32),
    shapes=((8, 8, 64), (32, 8, 128)),
    fp8_all=True,
) -> list:
    """Every kernel launch the wrappers make for the GPU path's shapes: by default bf16 / fp16 /
    fp32, GQA 1 and 4 (Llama-3-8B's) with head dims 64 and 128; and windows, soft-caps, the tree
    mask, the decode group pass; the FP8 GEMM in every config its tuner may pick (fp8_all; else
    each M bucket's first), with both scale layouts."""
    from radixlm.kernels.triton_ops import (
        decode_attention,
        elementwise,
        extend_attention,
        fp8_gemm,
        fused_moe,
        lora,
    )
    from radixlm.kernels.triton_ops.prefix_groups import find_prefix_groups

    calls: list = []
    modules = (extend_attention, decode_attention, elementwise, fused_moe, lora, fp8_gemm)
    saved = {}
    for mod in modules:
        for name, obj in vars(mod).items():
            if hasattr(obj, "arg_names") and hasattr(obj, "params") and name.endswith("_kernel"):
                saved[(mod, name)] = obj
                setattr(mod, name, Recorder(obj, calls))
    try:
        for dtype in dtypes:
            for heads, kvh, d in shapes:
                _attention(dtype, heads, kvh, d, find_prefix_groups)
            _layers(dtype)
        _attention(torch.bfloat16, 8, 2, 128, find_prefix_groups, 64, 30.0, tree=True, sinks=True)
        _fp8(fp8_gemm, fp8_all)
    finally:
        for (mod, name), obj in saved.items():
            setattr(mod, name, obj)
    return calls


def _attention(
    dtype, heads, kvh, d, find_prefix_groups, window=None, cap=0.0, tree=False, sinks=False
):
    from radixlm.kernels.triton_ops.decode_attention import decode_attention
    from radixlm.kernels.triton_ops.extend_attention import extend_attention

    bs, t = 3, 10
    k = torch.zeros(64, kvh, d, dtype=dtype)
    q = torch.zeros(t, heads, d, dtype=dtype)
    slots = torch.zeros(bs, 16, dtype=torch.int64)
    lens = torch.tensor([4, 3, 3])
    mask = (
        dict(custom_mask=torch.ones(34, dtype=torch.uint8), mask_start=torch.tensor([0, 16, 25]))
        if tree
        else {}
    )
    sink = dict(sinks=torch.zeros(heads, dtype=torch.float32)) if sinks else {}
    extend_attention(
        q,
        k,
        k,
        torch.empty_like(q),
        slots,
        torch.tensor([0, 4, 7]),
        lens,
        lens,
        4,
        0.1,
        cap,
        window,
        **mask,
        **sink,
    )
    seq = torch.tensor([8, 9, 5])
    qd = torch.zeros(bs, heads, d, dtype=dtype)
    groups = None if window is not None else find_prefix_groups(slots, seq)
    decode_attention(
        qd,
        k,
        k,
        torch.empty_like(qd),
        slots,
        seq,
        torch.zeros(bs, dtype=torch.int64),
        4,
        0.1,
        cap,
        window,
        groups,
        2,
        **sink,
    )


def _fp8(fp8_gemm, every_config: bool):
    """The FP8 GEMM at Llama-3-8B's o_proj shape, bfloat16 activations, each config with a scale per
    output row and with 128 x 128 blocks."""
    configs = (
        fp8_gemm.SMALL_M + fp8_gemm.MEDIUM_M + fp8_gemm.LARGE_M
        if every_config
        else [fp8_gemm.SMALL_M[0], fp8_gemm.MEDIUM_M[0], fp8_gemm.LARGE_M[0]]
    )
    x = torch.zeros(4, 4096, dtype=torch.bfloat16)
    w = torch.zeros(4096, 4096, dtype=torch.float8_e4m3fn)
    for config in configs:
        fp8_gemm.fp8_linear(x, w, torch.ones(4096), 0, config)
        fp8_gemm.fp8_linear(x, w, torch.ones(32, 32), fp8_gemm.SCALE_BLOCK, config)


def _layers(dtype):
    from radixlm.kernels.triton_ops.elementwise import TritonElementwiseOps as ops
    from radixlm.kernels.triton_ops.fused_moe import fused_experts_triton
    from radixlm.kernels.triton_ops.lora import lora_delta

    x = torch.zeros(4, 4096, dtype=dtype)
    ops.rmsnorm(x, torch.zeros(4096, dtype=dtype), 1e-5)
    ops.add_rmsnorm_(x, x.clone(), torch.zeros(4096, dtype=dtype), 1e-5)
    ops.silu_and_mul(torch.zeros(4, 2 * 1536, dtype=dtype))
    qkv = torch.zeros(4, (32 + 16) * 128, dtype=dtype)
    ops.rotary_embedding_(
        torch.zeros(4, dtype=torch.int64),
        qkv[:, :4096],
        qkv[:, 4096:5120],
        128,
        torch.zeros(16, 128),
    )
    kv = torch.zeros(4, 8, 128, dtype=dtype)
    ops.kv_store_(
        kv,
        kv,
        torch.zeros(4, dtype=torch.int64),
        torch.zeros(8, 8, 128, dtype=dtype),
        kv.new_zeros(8, 8, 128),
    )
    fused_experts_triton(
        torch.zeros(4, 256, dtype=dtype),
        torch.ones(4, 2),
        torch.zeros(4, 2, dtype=torch.int64),
        torch.zeros(8, 2 * 128, 256, dtype=dtype),
        torch.zeros(8, 256, 128, dtype=dtype),
    )
    lora_delta(
        torch.zeros(5, 256, dtype=dtype),
        torch.zeros(2, 16, 256, dtype=dtype),
        torch.zeros(2, 384, 16, dtype=dtype),
        torch.zeros(5, 384, dtype=dtype),
        torch.tensor([[0, 3], [3, 2], [1, -1]]),
        3,
    )


def main(quick: bool = False) -> int:
    """quick: bf16 and fp32 (the two dot paths) at Llama-3-8B's attention shape, as CI runs it."""
    assert os.environ.get("TRITON_INTERPRET") != "1", (
        "compiles for a GPU: run without TRITON_INTERPRET"
    )
    calls = (
        record_all((torch.bfloat16, torch.float32), ((32, 8, 128),), fp8_all=False)
        if quick
        else record_all()
    )
    seen, failures = set(), []
    t0 = time.perf_counter()
    for kernel, args, kwargs in calls:
        key = (
            kernel.__name__ if hasattr(kernel, "__name__") else repr(kernel),
            tuple(
                (
                    _type(a)
                    if not isinstance(a, (bool, int, float)) or isinstance(a, bool)
                    else type(a).__name__
                )
                for a in args
            ),
            tuple(sorted((k, repr(v)) for k, v in kwargs.items())),
        )
        if key in seen:
            continue
        seen.add(key)
        try:
            compiled = compile_call(kernel, args, kwargs)
            print(
                f"ok   {key[0]:<28} smem {compiled.metadata.shared:>6} B  {dict(kwargs)}",
                flush=True,
            )
        except Exception as e:
            failures.append(f"{key[0]} {kwargs}: {type(e).__name__}: {str(e)[:2000]}")
            print(f"FAIL {failures[-1]}", flush=True)
    print(
        f"{len(seen)} kernel variants compiled for sm_90 in {time.perf_counter() - t0:.0f} s,"
        f" {len(failures)} failed"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
