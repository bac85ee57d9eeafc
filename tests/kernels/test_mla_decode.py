"""The absorbed MLA decode (MLABackend's decode: q_nope @ W_UK, attention over the latent pool,
@ W_UV), native op and torch path, against the decompressed reference (kv_b_proj builds per-head
K and V, then plain softmax attention) on ragged batches at scattered slots of the latent pool."""

import pytest
import torch

from radixlm.cache.memory_pool import ReqToTokenPool
from radixlm.cache.mla_pool import MLATokenToKVPool
from radixlm.kernels.ops import ops
from radixlm.model.forward_batch import ForwardBatch, ForwardMode
from radixlm.model.layers.attention.mla_attention import MLAAttention
from radixlm.model.layers.attention.mla_backend import MLABackend
from radixlm.model.layers.attention.mla_native import mla_decode_native

HEADS, NOPE, ROPE, V, RANK = 8, 32, 16, 24, 64
LENS = [
    1,
    7,
    33,
    300,
    700,
]  # ragged: one row, under a block, past the 256-key split, several splits


def _batch(pool_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(LENS)
    pool = MLATokenToKVPool(total + 64, 1, RANK, ROPE, pool_dtype)
    req_pool = ReqToTokenPool(len(LENS) + 2, max(LENS) + 4)
    slots = torch.randperm(total + 64, generator=g)[:total] + 1
    rows, off = [], 0
    for n in LENS:
        row = req_pool.alloc()
        req_pool.req_to_token[row, :n] = slots[off : off + n]
        pool.set_kv_buffer(0, slots[off : off + n], torch.randn(n, 1, RANK + ROPE, generator=g))
        rows.append(row)
        off += n
    kv_b = torch.randn(HEADS * (NOPE + V), RANK, generator=g) * RANK**-0.5
    layer = MLAAttention(HEADS, NOPE, ROPE, V, RANK, (NOPE + ROPE) ** -0.5, 0, lambda: kv_b)
    q = torch.randn(len(LENS), HEADS, NOPE + ROPE, generator=g) * 2
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(LENS),
        input_ids=torch.zeros(len(LENS), dtype=torch.int64),
        positions=torch.tensor([n - 1 for n in LENS]),
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(LENS),
        out_cache_loc=torch.zeros(len(LENS), dtype=torch.int64),
        req_to_token_pool=req_pool,
        token_to_kv_pool=pool,
        seq_lens_cpu=list(LENS),
    )
    return q, layer, fb


def _decode(backend, q, layer, fb):
    fb.attn_backend, fb.attn_metadata = backend, None
    backend.init_forward_metadata(fb)
    return backend.forward_decode(q, None, None, layer, fb)


def _naive_reference(q, layer, fb):
    """Each request alone, every head's K and V decompressed, softmax attention in float64."""
    w = layer.kv_b_weight().double().view(HEADS, NOPE + V, RANK)
    lat_buf = fb.token_to_kv_pool.get_latent_buffer(0).double()
    out = []
    for i, n in enumerate(LENS):
        lat = lat_buf[fb.req_to_token_pool.req_to_token[fb.req_pool_indices[i], :n]]
        k_nope = torch.einsum("sr,hnr->hsn", lat[:, :RANK], w[:, :NOPE])
        v = torch.einsum("sr,hvr->hsv", lat[:, :RANK], w[:, NOPE:])
        k = torch.cat((k_nope, lat[None, :, RANK:].expand(HEADS, -1, -1)), dim=-1)
        p = (torch.einsum("hd,hsd->hs", q[i].double(), k) * layer.scaling).softmax(-1)
        out.append(torch.einsum("hs,hsv->hv", p, v))
    return torch.stack(out).float()


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_absorbed_decode_equals_decompressed(pool_dtype):
    assert hasattr(ops(), "mla_decode")
    q, layer, fb = _batch(pool_dtype)
    buf = fb.token_to_kv_pool.get_latent_buffer(0)
    assert (
        mla_decode_native(
            torch.randn(1, HEADS, RANK + ROPE),
            buf,
            torch.ones(1, 1, dtype=torch.int64),
            torch.tensor([1]),
            RANK,
            1.0,
        )
        is not None
    )  # the backend's native path does run
    ref = _naive_reference(q, layer, fb)
    decompressed = _decode(MLABackend(absorb=False), q, layer, fb)
    native = _decode(MLABackend(absorb=True, native=True), q, layer, fb)
    torch_path = _decode(MLABackend(absorb=True, native=False), q, layer, fb)
    scale = ref.abs().max().item()
    for name, got in (("decompressed", decompressed), ("native", native), ("torch", torch_path)):
        diff = (got - ref).abs().max().item()
        assert diff < 1e-4 * max(1.0, scale), f"{name} ({pool_dtype}): max|diff| {diff:.2e}"
    assert (native - decompressed).abs().max().item() < 1e-4


def test_native_op_checks_its_inputs():
    _, _, fb = _batch(torch.float32)
    buf = fb.token_to_kv_pool.get_latent_buffer(0)
    q_lat = torch.randn(1, HEADS, RANK + ROPE)
    idx = torch.ones(1, 4, dtype=torch.int64)
    assert ops().mla_decode(q_lat, buf, idx, torch.tensor([4]), RANK, 0.1).shape == (1, HEADS, RANK)
    with pytest.raises(RuntimeError, match="lens"):
        ops().mla_decode(q_lat, buf, idx, torch.tensor([5]), RANK, 0.1)
    with pytest.raises(RuntimeError, match="slot out of range"):
        ops().mla_decode(q_lat, buf, idx * 10**6, torch.tensor([4]), RANK, 0.1)
    with pytest.raises(RuntimeError, match="D"):
        ops().mla_decode(q_lat[..., :-8].contiguous(), buf, idx, torch.tensor([4]), RANK, 0.1)
