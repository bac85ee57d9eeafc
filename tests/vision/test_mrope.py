"""M-RoPE against transformers: the three positions of every token (model/executor/mrope.py) equal
Qwen2VLModel.get_rope_index's for random layouts of text and images of any grid, over the whole
prompt, any range of it (a chunk, a cache hit's remainder) and any set of indices (a verify step);
tokens after the prompt sit at index + delta (HF's rope_deltas); MRotaryEmbedding rotates q and k as
HF's Qwen2VLRotaryEmbedding + apply_rotary_pos_emb do."""

import numpy as np
import pytest
import torch

from radixlm.mm_inputs import MultimodalInputs, MultimodalItem
from radixlm.model.executor.mrope import mrope_delta, mrope_positions, request_positions
from radixlm.model.executor.worker_batch import ModelWorkerBatch
from radixlm.model.forward_batch import ForwardMode

IMAGE = 5  # the image token id in these layouts


@pytest.fixture(scope="module")
def hf_model():
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=16,
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            bos_token_id=1,
            eos_token_id=2,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [1, 1, 2],
                "rope_theta": 10000.0,
            },
        ),
        vision_config=dict(depth=1, embed_dim=8, hidden_size=16, num_heads=2, spatial_merge_size=2),
        image_token_id=IMAGE,
    )
    return Qwen2VLModel(cfg).eval()


def layout(rng):
    """(token ids, items, HF's pre-merge grids): text runs (at least one token between two images:
    transformers takes adjacent image tokens as one image) and images of random grids."""
    ids, items, grids = list(rng.integers(6, 16, rng.integers(0, 6))), [], []
    for _ in range(rng.integers(1, 4)):
        t, h, w = 1, int(rng.integers(1, 6)), int(rng.integers(1, 6))
        items.append(
            MultimodalItem(
                hash=len(items), offset=len(ids), length=h * w, pixel_values=None, grid=(t, h, w)
            )
        )
        grids.append([t, 2 * h, 2 * w])
        ids += [IMAGE] * (h * w) + list(rng.integers(6, 16, rng.integers(1, 6)))
    return ids, MultimodalInputs(tuple(items)), torch.tensor(grids)


def hf_positions(hf_model, ids, grids):
    input_ids = torch.tensor([ids])
    pos, delta = hf_model.get_rope_index(
        input_ids, (input_ids == IMAGE).int(), image_grid_thw=grids
    )
    return pos[:, 0].numpy(), int(delta)


@pytest.mark.parametrize("seed", range(12))
def test_positions_equal_get_rope_index(hf_model, seed):
    rng = np.random.default_rng(seed)
    ids, mm, grids = layout(rng)
    ref, delta = hf_positions(hf_model, ids, grids)
    n = len(ids)
    assert (request_positions(mm, np.arange(n)) == ref).all()
    assert mrope_delta(mm) == delta
    a, b = sorted(
        rng.integers(0, n + 1, 2)
    )  # a chunk, or what follows a cache hit, may cut an image anywhere
    assert (request_positions(mm, np.arange(a, b)) == ref[:, a:b]).all()
    picks = rng.permutation(n)[: rng.integers(1, n + 1)]
    assert (request_positions(mm, picks) == ref[:, picks]).all()
    after = np.arange(n, n + 7)  # generated tokens: index + delta in all three
    assert (request_positions(mm, after) == np.repeat(after[None] + delta, 3, axis=0)).all()


def test_batch_positions_follow_each_request(hf_model):
    """A mixed batch: a chunk of an image request, a text request and a decode token after an
    image."""
    rng = np.random.default_rng(99)
    ids, mm, grids = layout(rng)
    ref, delta = hf_positions(hf_model, ids, grids)
    n = len(ids)
    positions = list(range(2, n)) + [10, 11, 12] + [n + 3]
    b = ModelWorkerBatch(
        ForwardMode.MIXED,
        [0] * len(positions),
        positions,
        [0, 1, 2],
        [n, 13, n + 4],
        torch.zeros(len(positions), dtype=torch.int64),
        extend_prefix_lens=[2, 10, n + 3],
        extend_seq_lens=[n - 2, 3, 1],
        num_decode=1,
        mm_inputs=[mm, None, mm],
    )
    got = mrope_positions(b, torch.device("cpu")).numpy()
    assert (got[:, : n - 2] == ref[:, 2:]).all()
    assert (got[:, n - 2 : n + 1] == [[10, 11, 12]] * 3).all()
    assert (got[:, -1] == n + 3 + delta).all()
    text_only = ModelWorkerBatch(
        ForwardMode.DECODE, [0], [7], [0], [8], torch.zeros(1, dtype=torch.int64)
    )
    assert mrope_positions(text_only, torch.device("cpu")) is None  # plain RoPE at `positions`


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["native", "torch"])
def test_mrotary_embedding_rotates_as_hf(dtype):
    from transformers import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    from radixlm.model.layers.rotary import MRotaryEmbedding, get_rope

    cfg = Qwen2VLTextConfig(
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 1e6},
    )
    rope = get_rope(32, cfg)
    assert isinstance(rope, MRotaryEmbedding)
    g = torch.Generator().manual_seed(0)
    n = 23
    pos = torch.randint(0, 200, (3, n), generator=g)
    q, k = (
        torch.randn(n, 4 * 32, generator=g, dtype=dtype),
        torch.randn(n, 2 * 32, generator=g, dtype=dtype),
    )
    cos, sin = Qwen2VLRotaryEmbedding(cfg)(q.float(), pos[:, None, :])
    hq, hk = apply_rotary_pos_emb(
        q.view(1, n, 4, 32).transpose(1, 2).float(),
        k.view(1, n, 2, 32).transpose(1, 2).float(),
        cos,
        sin,
    )
    gq, gk = rope(pos, q.clone(), k.clone())
    torch.testing.assert_close(gq.float(), hq.transpose(1, 2).reshape(n, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gk.float(), hk.transpose(1, 2).reshape(n, -1), atol=1e-5, rtol=1e-5)
    same = pos[:1].expand(3, n)  # equal rows: plain RoPE at those positions
    torch.testing.assert_close(
        rope(same, q.clone(), k.clone())[0], rope(pos[0], q.clone(), k.clone())[0]
    )
