"""Triton kernels for the GPU path: paged attention (extend and split-KV decode over the KV pool by
slot), the KV store, RMSNorm, RoPE, SiLU-and-mul, fused MoE and LoRA's segmented shrink / expand.

They compile for CUDA, and run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1 set
before triton is imported), which is how CI proves them without a GPU (tests/triton/). The kernel
modules are imported only when a component that uses them is built, so a process without triton
(or on CPU without the interpreter) never imports it. They are written against the API that
triton 3.6 (the GPU machines') and 3.9 share: loads and stores with masks, tl.dot, tl.exp, tl.where,
constexpr branches; nothing newer.

One difference between the interpreter and a GPU is handled here: the interpreter's tl.dot is wrong
on bfloat16 operands (triton 3.9), so under it a bfloat16 kernel upcasts the dot's operands to
float32 (`dot_in_f32`); on a GPU bfloat16 runs on the tensor cores as itself.
"""

from __future__ import annotations

import os

import torch

INTERPRET_ENV = "TRITON_INTERPRET"


def interpreting() -> bool:
    """Whether Triton kernels run in the interpreter (read when a kernel module is imported)."""
    return os.environ.get(INTERPRET_ENV) == "1"


def unavailable_reason(device: torch.device) -> str | None:
    """None where the Triton kernels can run on `device`, else why not."""
    if device.type not in ("cuda", "cpu"):
        return f"the Triton kernels run on CUDA, not {device.type}"
    if device.type == "cpu" and not interpreting():
        return (
            "the Triton kernels run on CUDA (on CPU only under Triton's interpreter,"
            f" {INTERPRET_ENV}=1, for tests)"
        )
    try:
        import triton  # noqa: F401 (imported for its side effect: the interpreter mode is read at import)
    except ImportError:
        return "triton is not installed"
    if device.type == "cuda" and interpreting():
        return f"{INTERPRET_ENV}=1 runs Triton's interpreter, which reads CPU tensors only"
    return None


def available(device: torch.device) -> bool:
    return unavailable_reason(device) is None


def dot_in_f32(dtype: torch.dtype) -> bool:
    """Whether a kernel's dot products run in float32: float32 data (IEEE precision, no TF32), and
    bfloat16 under the interpreter (its tl.dot mishandles bfloat16)."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting())


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


MAX_DECODE_SPLITS = 16


def decode_splits(batch_size: int, kv_heads: int, sms: int) -> int:
    """KV splits per request of split-KV decode: enough programs to fill the GPU about twice at any
    length (a split with no keys costs a program that stores -inf); the same for every length, so
    a graph captured for a batch size serves every step."""
    programs = max(1, batch_size * kv_heads)
    return max(1, min(MAX_DECODE_SPLITS, (2 * sms + programs - 1) // programs))


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (what split-KV sizes its grid by); 8 elsewhere
    (the interpreter, or a spec naming CUDA on a machine without one)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8
