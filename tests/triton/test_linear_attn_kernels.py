"""The triton linear-attention backend (kernels/triton_ops/linear_attn.py) against the float64
references of tests/kernels/test_linear_attn.py and test_kda.py: the same batches (decode and
extends mixed, rows out of order, GVA, SSD groups, KDA's fast-decaying channels, strided inputs, a
bfloat16 state, rows outside the batch untouched), at smaller sizes where the interpreter is
slow."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_kda import check_kda
from tests.kernels.test_linear_attn import DECODE, check_conv, check_gdr, check_ssd
from tests.triton.conftest import requires_triton

pytestmark = requires_triton

# The interpreter runs a program's token loop at about a millisecond per operation: shorter
# extends than the CPU tests' (the kernels have no chunks, so 64 / 65 are no boundary here).
MIXED = ([1, 3, 12, 5], [5, 2, 7, 0])
BATCHES = pytest.mark.parametrize("seq_lens,rows", [MIXED, DECODE], ids=["mixed", "decode"])
STATE_DTYPES = pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])


@pytest.fixture
def backend(triton_device):
    from radixlm.model.layers.linear_attn import create_linear_attn_backend

    return create_linear_attn_backend("triton", triton_device)


@BATCHES
@STATE_DTYPES
def test_causal_conv1d(backend, triton_device, seq_lens, rows, state_dtype):
    check_conv(backend, seq_lens, rows, triton_device, state_dtype=state_dtype, c=40)


def test_causal_conv1d_short_requests_no_bias(backend, triton_device):
    """Requests shorter than the history keep part of it; no bias, no activation; K = 2 and 4."""
    for k in (2, 4):
        check_conv(backend, [2, 1, 9], [1, 8, 4], triton_device, bias=False, activation=None, k=k)


@BATCHES
@STATE_DTYPES
def test_gated_delta_rule(backend, triton_device, seq_lens, rows, state_dtype):
    check_gdr(
        backend, seq_lens, rows, triton_device, state_dtype=state_dtype, hk=1, hv=2, dk=16, dv=40
    )


@BATCHES
@STATE_DTYPES
def test_kimi_delta_rule(backend, triton_device, seq_lens, rows, state_dtype):
    check_kda(backend, seq_lens, rows, triton_device, state_dtype=state_dtype, h=2, dk=16, dv=40)


def test_kimi_delta_rule_sizes_off_the_blocks(backend, triton_device):
    """A key dim and value columns short of their blocks (masked lanes), a float16 state."""
    check_kda(backend, [4, 1], [3, 8], triton_device, h=1, dk=12, dv=36, state_dtype=torch.float16)


@BATCHES
@STATE_DTYPES
def test_ssd(backend, triton_device, seq_lens, rows, state_dtype):
    check_ssd(backend, seq_lens, rows, triton_device, state_dtype=state_dtype, p=16, n=12)


def test_auto_picks_triton_on_cuda_only(triton_device):
    from radixlm.model.layers.linear_attn import create_linear_attn_backend

    expected = "triton" if triton_device.type == "cuda" else "native"
    if triton_device.type == "cpu":
        from radixlm import kernels

        if not kernels.available():
            expected = "torch"
    assert create_linear_attn_backend("auto", triton_device).name == expected
