"""The element-wise kernels (kernels/triton_ops/elementwise.py) against the layers' own torch code,
the fused MoE grouped GEMM against fused_experts_torch (and its gateless form against Nemotron-H's
experts), and LoRA's segmented shrink / expand against the gather path of lora/delta.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlm.model.layers.norm import RMSNorm
from radixlm.model.layers.rotary import RotaryEmbedding
from tests.triton.conftest import DTYPES, assert_close, requires_triton

pytestmark = requires_triton


def ops():
    from radixlm.kernels.triton_ops.elementwise import TritonElementwiseOps

    return TritonElementwiseOps


def rand(g, *shape, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rmsnorm_and_residual_add(triton_device, dtype):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, 1e-5)
    norm.weight.data = rand(g, 96, dtype=dtype)
    x, r = rand(g, 7, 96, dtype=dtype), rand(g, 7, 96, dtype=dtype)
    got = ops().rmsnorm(x.to(triton_device), norm.weight.to(triton_device), 1e-5)
    assert_close(got.cpu(), norm._norm(x), dtype, "rmsnorm")
    xd, rd = x.to(triton_device, copy=True), r.to(triton_device, copy=True)
    ops().add_rmsnorm_(xd, rd, norm.weight.to(triton_device), 1e-5)
    assert_close(rd.cpu(), x + r, dtype, "residual")
    assert_close(xd.cpu(), norm._norm(x + r), dtype, "add + rmsnorm")


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(triton_device, dtype):
    g = torch.Generator().manual_seed(1)
    x = rand(g, 5, 2 * 80, dtype=dtype)
    assert_close(
        ops().silu_and_mul(x.to(triton_device)).cpu(),
        F.silu(x[:, :80]) * x[:, 80:],
        dtype,
        "silu * up",
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rotary_in_place_on_the_qkv_views(triton_device, dtype, partial):
    """q and k are column slices of the fused qkv projection (row stride = its width), as the model
    hands them over; partial rotary (Phi-style) rotates the first dims of each head only."""
    g = torch.Generator().manual_seed(2)
    rope = RotaryEmbedding(
        32, 128, {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": partial}
    )
    qkv = rand(g, 6, 32 * 6 + 2 * 32 * 2, dtype=dtype)
    pos = torch.tensor([0, 3, 7, 127, 10, 64])
    q, k, _ = qkv.split([192, 64, 64], -1)
    cos, sin = rope.cos_sin_cache[pos].to(dtype).unsqueeze(1).chunk(2, dim=-1)
    ref_q, ref_k = rope._rotate(q, cos, sin), rope._rotate(k, cos, sin)
    qkv_d = qkv.to(triton_device, copy=True)
    qd, kd, vd = qkv_d.split([192, 64, 64], -1)
    ops().rotary_embedding_(pos.to(triton_device), qd, kd, 32, rope.cos_sin_cache.to(triton_device))
    assert_close(qd.cpu(), ref_q, dtype, "q")
    assert_close(kd.cpu(), ref_k, dtype, "k")
    assert torch.equal(vd.cpu(), qkv[:, 256:]), "v is left alone"


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_kv_store_at_slots(triton_device, kv_dtype):
    g = torch.Generator().manual_seed(3)
    k = rand(g, 5, 2 * 32 + 16, dtype=torch.bfloat16)[:, :64].reshape(
        5, 2, 32
    )  # a strided view, as from qkv
    v = rand(g, 5, 2, 32, dtype=torch.bfloat16)
    k_buf = torch.zeros(20, 2, 32, dtype=kv_dtype, device=triton_device)
    v_buf = torch.zeros(20, 2, 32, dtype=kv_dtype, device=triton_device)
    loc = torch.tensor([3, 9, 1, 17, 4])
    ops().kv_store_(k.to(triton_device), v.to(triton_device), loc.to(triton_device), k_buf, v_buf)
    assert torch.equal(k_buf[loc.to(triton_device)].cpu(), k.to(kv_dtype))
    assert torch.equal(v_buf[loc.to(triton_device)].cpu(), v.to(kv_dtype))
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[loc] = False
    assert not k_buf.cpu()[untouched].any() and not v_buf.cpu()[untouched].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_moe_grouped_gemm(triton_device, dtype):
    """Tokens routed to 2 of 6 experts (one slot of a token routed elsewhere: id -1, left out; one
    expert chosen by nobody), against the per-expert torch loop in float32."""
    from radixlm.kernels.triton_ops.fused_moe import fused_experts_triton
    from radixlm.model.layers.moe.experts import ExpertWeights
    from radixlm.model.layers.moe.fused_moe import fused_experts_torch

    g = torch.Generator().manual_seed(4)
    t, h, inter, e, k = 9, 48, 40, 6, 2
    x = rand(g, t, h, dtype=dtype)
    w13, w2 = (
        rand(g, e, 2 * inter, h, dtype=dtype, scale=0.2),
        rand(g, e, h, inter, dtype=dtype, scale=0.2),
    )
    logits = torch.randn(t, e, generator=g)
    logits[:, 5] = -1e9  # expert 5: nobody's
    weights, ids = torch.softmax(logits, -1).topk(k, -1)
    ids[2, 1] = -1
    ref = fused_experts_torch(
        x.float(),
        weights,
        ids,
        ExpertWeights(w13.float(), None, 2 * inter, h),
        ExpertWeights(w2.float(), None, h, inter),
    )
    dev = triton_device
    got = fused_experts_triton(x.to(dev), weights.to(dev), ids.to(dev), w13.to(dev), w2.to(dev))
    assert_close(got.cpu(), ref, dtype, "fused moe")


def test_moe_align_pads_each_expert_to_blocks(triton_device):
    from radixlm.kernels.triton_ops.fused_moe import moe_align

    ids = torch.tensor([[2, 0], [2, -1], [0, 2], [3, 2]], device=triton_device)
    pairs, experts = moe_align(ids, 5, 4)
    n = ids.numel()
    assert experts.tolist() == [
        0,
        2,
        3,
        -1,
        -1,
        -1,
    ]  # worst case: 8 pairs + 5 x 3 padding -> 6 blocks
    runs = pairs.view(-1, 4).tolist()
    assert runs[0] == [1, 4, n, n] and runs[1] == [0, 2, 5, 7] and runs[2] == [6, n, n, n]
    assert all(p == n for row in runs[3:] for p in row)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lora_segmented_delta_equals_the_gather_path(triton_device, dtype):
    """Requests under adapter slots 1, none, 0, 1 (one decode-like row of one token): one shrink and
    one expand launch for the batch give each token its own adapter's delta."""
    from radixlm.lora.delta import GatherLoRADelta, SegmentedLoRADelta

    g = torch.Generator().manual_seed(5)
    slots, counts = [1, -1, 0, 1], [5, 1, 20, 3]
    x = rand(g, sum(counts), 40, dtype=dtype)
    a, b = rand(g, 3, 24, 40, dtype=dtype, scale=0.3), rand(g, 3, 56, 24, dtype=dtype, scale=0.3)
    base = rand(g, sum(counts), 56, dtype=dtype)
    ref = GatherLoRADelta()
    ref.begin(slots, counts, torch.device("cpu"))
    want = base.float().clone()
    ref.apply(x.float(), want, a.float(), b.float())
    seg = SegmentedLoRADelta()
    seg.begin(slots, counts, triton_device)
    got = base.to(triton_device, copy=True)
    seg.apply(x.to(triton_device), got, a.to(triton_device), b.to(triton_device))
    assert_close(got.cpu(), want, dtype, "lora delta")
    seg.begin([-1, -1], [3, 1], triton_device)
    assert not seg.active  # a batch of base-model requests runs no kernel


@pytest.mark.parametrize("dtype", DTYPES)
def test_gateless_experts_grouped_gemm(triton_device, dtype):
    """Nemotron-H's experts without a gate (down(relu²(up x))) through the grouped GEMM, against
    NemotronHExperts' per-expert loop in float32 (one expert chosen by nobody)."""
    from radixlm.kernels.triton_ops.fused_moe import gateless_experts_triton
    from radixlm.model.models.nemotron_h import mlp_activation
    from radixlm.model.models.nemotron_h_moe import NemotronHExperts

    g = torch.Generator().manual_seed(5)
    t, h, inter, e, k = 9, 48, 40, 6, 2
    x = rand(g, t, h, dtype=dtype)
    up, down = (
        rand(g, e, inter, h, dtype=dtype, scale=0.2),
        rand(g, e, h, inter, dtype=dtype, scale=0.2),
    )
    logits = torch.randn(t, e, generator=g)
    logits[:, 5] = -1e9  # expert 5: nobody's
    weights, ids = torch.sigmoid(logits).topk(k, -1)
    act = mlp_activation(type("Config", (), {"mlp_hidden_act": "relu2"})())
    experts = NemotronHExperts(e, h, inter, act)
    experts.load("up_proj", None, up.float())
    experts.load("down_proj", None, down.float())
    ref = experts(x.float(), weights, ids)
    dev = triton_device
    got = gateless_experts_triton(
        x.to(dev), weights.to(dev), ids.to(dev), up.to(dev), down.to(dev), act
    )
    assert_close(got.cpu(), ref, dtype, "gateless experts")
