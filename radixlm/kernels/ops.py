"""Python entry points of the native ops (torch.ops.radixlm), with fake (meta) implementations
so torch.compile can trace through them."""

from __future__ import annotations

import torch

from radixlm.kernels import build

_ops = None


def ops():
    """torch.ops.radixlm with the kernels loaded; RuntimeError if they cannot be. Cached in a plain
    global (not functools.cache), so that torch.compile reads it as a constant once it is set."""
    global _ops
    if _ops is None:
        if not build.load():
            raise RuntimeError(f"radixlm native kernels unavailable: {build.unavailable_reason()}")
        _register_fakes()
        from radixlm.kernels import calibrate

        calibrate.ensure(build.build_dir())  # the fastest level of each kernel on this machine
        _ops = torch.ops.radixlm
    return _ops


_cpu_ops = None


def cpu_float_ops(x: torch.Tensor):
    """torch.ops.radixlm when x is a CPU float32 tensor and the kernels loaded, else None: the
    element-wise layers take the fused op then and their torch code otherwise."""
    global _cpu_ops
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    if _cpu_ops is None:
        _cpu_ops = ops() if build.load() else False
    return _cpu_ops or None


_cuda_ops = None


def fused_ops(x: torch.Tensor):
    """The fused element-wise ops for x's device (RMSNorm, add + RMSNorm, SiLU-and-mul, RoPE, the KV
    store, under the native ops' names): the native ops for CPU float32 (cpu_float_ops), the Triton
    kernels on CUDA (kernels/triton_ops/elementwise.py), else None (the layer's torch code)."""
    global _cuda_ops
    if x.device.type != "cuda":
        return cpu_float_ops(x)
    if _cuda_ops is None:
        from radixlm.kernels import triton_ops

        if triton_ops.available(x.device):
            from radixlm.kernels.triton_ops.elementwise import TritonElementwiseOps

            _cuda_ops = TritonElementwiseOps()
        else:
            _cuda_ops = False
    return _cuda_ops or None


def _weight_rows(w: torch.Tensor, fmt: int) -> int:
    from radixlm.kernels.formats import INTERLEAVED

    group = next((f.group for f in INTERLEAVED.values() if f.kernel_id == fmt), 1)
    return w.shape[0] * group


def _register_fakes() -> None:
    def qlinear_fake(x, w, fmt, bias=None):
        return x.new_empty(x.shape[0], _weight_rows(w, fmt))

    def dequantize_fake(w, fmt, cols):
        return torch.empty(_weight_rows(w, fmt), cols, dtype=torch.float32, device=w.device)

    def dequantize_rows_fake(w, fmt, cols, ids):
        return torch.empty(ids.numel(), cols, dtype=torch.float32, device=w.device)

    def rmsnorm_fake(x, weight, eps):
        return torch.empty_like(x)

    def silu_and_mul_fake(x):
        return x.new_empty(x.shape[0], x.shape[1] // 2)

    def inplace_fake(*args):
        return None

    def llama_layers_fake(hidden, *args):
        return torch.empty_like(hidden)

    def paged_attention_fake(q, *args):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    def fused_moe_fake(hidden, topk_ids, topk_weights, w13, w13_fmt, w2, w2_fmt, *args, **kwargs):
        return torch.empty_like(hidden, memory_format=torch.contiguous_format)

    def router_gemm_fake(x, w, bias=None):
        return x.new_empty(x.shape[0], w.shape[0])

    def argmax_rows_fake(logits):
        return logits.new_empty(logits.shape[0], dtype=torch.int64)

    def recurrence_fake(x, *args):  # the linear-attention ops: the output has x's (or v's) shape
        return x.new_empty(x.shape)

    def gated_delta_rule_fake(q, k, v, *args):
        return v.new_empty(v.shape)

    def gated_rmsnorm_fake(x, z, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    for name, fn in (
        ("qlinear", qlinear_fake),
        ("dequantize", dequantize_fake),
        ("dequantize_rows", dequantize_rows_fake),
        ("rmsnorm", rmsnorm_fake),
        ("silu_and_mul", silu_and_mul_fake),
        ("add_rmsnorm_", inplace_fake),
        ("rotary_embedding_", inplace_fake),
        ("qlinear_out", inplace_fake),
        ("paged_attention", paged_attention_fake),
        ("kv_store_", inplace_fake),
        ("llama_layers", llama_layers_fake),
        ("qwen3_5_layers", llama_layers_fake),
        ("gpt_oss_layers", llama_layers_fake),
        ("fused_moe", fused_moe_fake),
        ("router_gemm", router_gemm_fake),
        ("argmax_rows", argmax_rows_fake),
        ("lora_delta_", inplace_fake),
        ("causal_conv1d", recurrence_fake),
        ("gated_delta_rule", gated_delta_rule_fake),
        ("gated_delta_rule_gated", gated_delta_rule_fake),
        ("kimi_delta_rule", gated_delta_rule_fake),
        ("gated_rmsnorm", gated_rmsnorm_fake),
        ("ssd_update", recurrence_fake),
    ):
        try:
            torch.library.register_fake(f"radixlm::{name}")(fn)
        except RuntimeError:  # registered already (a second import path)
            pass
