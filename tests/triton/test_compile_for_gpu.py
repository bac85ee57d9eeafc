"""Every Triton kernel compiles for a Hopper GPU (sm_90) here, without one: the code generation the
interpreter skips (tests/triton/compile_for_gpu.py), in a process without TRITON_INTERPRET. With a
GPU present the other tests of this package compile the kernels for it instead."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.triton.conftest import requires_triton

pytestmark = [
    requires_triton,
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="a GPU is present: tests/triton compiles for it"
    ),
]


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.triton.compile_for_gpu", "--quick"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (
        "0 failed" in proc.stdout
        and "_extend_kernel" in proc.stdout
        and "_moe_gemm_kernel" in proc.stdout
        and "_fp8_gemm_kernel" in proc.stdout
    )
