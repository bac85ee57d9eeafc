"""The Triton kernels' tests. Without a GPU they run in Triton's interpreter on CPU tensors:
TRITON_INTERPRET=1 is set for this package's tests only (and put back after), before any kernel
module is imported (a @triton.jit kernel is interpreted or compiled as its module is imported, so
the test modules import the kernels inside their tests). With CUDA the same tests compile the
kernels and run on the GPU."""

import importlib.util
import os

import pytest
import torch

from radixlm.kernels.triton_ops import INTERPRET_ENV

# A missing triton is an incomplete test environment (it is in the `test` extra): each module's
# tests say so (pytestmark = requires_triton) rather than fail to import.
requires_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install -e .[test])",
)


@pytest.fixture(scope="package", autouse=True)
def triton_device():
    """cuda where there is a GPU, else cpu with the interpreter on (while this package runs)."""
    if torch.cuda.is_available():
        yield torch.device("cuda")
        return
    old = os.environ.get(INTERPRET_ENV)
    os.environ[INTERPRET_ENV] = "1"
    try:
        yield torch.device("cpu")
    finally:
        if old is None:
            os.environ.pop(INTERPRET_ENV, None)
        else:
            os.environ[INTERPRET_ENV] = old


# The dtypes each kernel test runs in. On a GPU float16 takes bfloat16's code path (the tensor
# cores' other 16-bit type): two of them keep the compile time of the one GPU run down.
DTYPES = (
    [torch.float32, torch.bfloat16]
    if torch.cuda.is_available()
    else [torch.float32, torch.float16, torch.bfloat16]
)


def tolerance(dtype: torch.dtype) -> float:
    """Largest error allowed, relative to the largest reference value: float32 to its rounding; the
    16-bit types to a few units of their last place (the kernels round where the torch code rounds;
    the interpreter rounds float32 -> bfloat16 toward zero, so bfloat16 gets more room)."""
    return {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]


def assert_close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    err = (got.float() - ref.float()).abs().max().item()
    scale = max(ref.float().abs().max().item(), 1.0)
    assert err <= tolerance(dtype) * scale, (
        f"{what}: max error {err:.3g} > {tolerance(dtype)} x {scale:.3g}"
    )
