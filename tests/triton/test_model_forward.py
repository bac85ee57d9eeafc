"""A tiny random Llama (GQA) through TritonAttnBackend equals it through the torch backend, step for
step, with the same slots: prefill, an extend over a prefix shared in the pool, decode steps whose
requests share a 40-token prefix (the group pass), a MIXED batch and a TARGET_VERIFY batch; and the
whole sequence's logits equal transformers'. A tiny gpt-oss (attention sinks, windowed layers)
through TritonAttnBackend equals transformers' logits."""

from __future__ import annotations

import pytest
import torch

from radixlm.model.layers.attention import AttentionBackendSpec, TorchSDPABackend
from radixlm.model.layers.attention.triton_backend import TritonAttnBackend
from radixlm.model.loader import load_model
from tests.model.gpt_oss_checkpoint import check_logits, gpt_oss_checkpoint
from tests.model.helpers import SMALL, PoolHarness, hf_logits, save_random_llama
from tests.model.windowed_checkpoints import WINDOW
from tests.triton.conftest import requires_triton

pytestmark = requires_triton

ATOL = 1e-4  # float32, as tests/model/test_logits.py


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    hf, config = save_random_llama(path)
    return hf, config, str(path)


def test_triton_backend_equals_torch_backend_through_the_model(tiny, triton_device, monkeypatch):
    from radixlm.kernels.triton_ops import prefix_groups

    hf, config, path = tiny
    starts = []  # each decode step's kv_start: where its group pass left each request's own keys
    find = prefix_groups.find_prefix_groups
    monkeypatch.setattr(
        prefix_groups,
        "find_prefix_groups",
        lambda *a, **kw: starts.append(find(*a, **kw)) or starts[-1],
    )
    model = load_model(path, device=str(triton_device)).model
    spec = AttentionBackendSpec(
        head_dim=16, dtype=torch.float32, kv_dtype=torch.float32, device=triton_device
    )
    # The same scrambled slots for both.
    ours = PoolHarness(
        model, config, attn_backend=TritonAttnBackend(spec), seed=7, device=triton_device
    )
    ref = PoolHarness(model, config, attn_backend=TorchSDPABackend(), seed=7, device=triton_device)
    g = torch.Generator().manual_seed(1)
    tokens = lambda n: torch.randint(0, SMALL["vocab_size"], (n,), generator=g).tolist()
    a_prompt, b_tail, c_prompt, d_prompt = tokens(45), tokens(6), tokens(12), tokens(5)
    seqs = {}

    def both(step):
        got, want = step(ours), step(ref)
        for i, (x, y) in enumerate(zip(got, want)):
            diff = (x - y).abs().max().item()
            assert diff < ATOL, f"row {i}: triton vs torch logits differ by {diff:.3g}"
        return got

    reqs = {h: {} for h in (ours, ref)}
    for h in (ours, ref):
        reqs[h]["a"] = h.new_request()
    both(lambda h: h.extend([reqs[h]["a"]], [a_prompt]))
    for h in (ours, ref):  # b holds a's first 40 slots (a radix hit), c nothing
        reqs[h]["b"] = h.new_request(share_prefix_of=reqs[h]["a"], prefix_len=40)
        reqs[h]["c"] = h.new_request()
    both(lambda h: h.extend([reqs[h]["b"], reqs[h]["c"]], [b_tail, c_prompt]))
    seqs["a"], seqs["b"], seqs["c"] = list(a_prompt), a_prompt[:40] + b_tail, list(c_prompt)
    for _ in range(3):  # a and b decode over their shared 40 slots: the group pass
        nxt = tokens(3)
        both(lambda h: [h.decode([reqs[h][r] for r in "abc"], nxt)])
        for r, t in zip("abc", nxt):
            seqs[r].append(t)
    assert [g.kv_start.tolist() for g in starts] == [[40, 40, 0]] * 3
    for h in (ours, ref):
        reqs[h]["d"] = h.new_request()
    nxt = tokens(3)
    both(lambda h: h.mixed([reqs[h]["d"]], [d_prompt], [reqs[h][r] for r in "abc"], nxt))
    for r, t in zip("abc", nxt):
        seqs[r].append(t)
    drafts = [tokens(4), tokens(3)]
    last = both(lambda h: h.verify([reqs[h]["a"], reqs[h]["c"]], drafts))
    for r, d, rows in zip("ac", drafts, last):
        full = seqs[r] + d
        want = hf_logits(hf, full)[-len(d) :]
        assert (rows.cpu() - want).abs().max().item() < ATOL, f"request {r}: triton vs transformers"


def test_gpt_oss_sinks_and_windows_through_the_triton_backend(tmp_path, triton_device):
    path = str(tmp_path)
    hf = gpt_oss_checkpoint(path)
    model = load_model(path, device=str(triton_device)).model
    spec = AttentionBackendSpec(
        head_dim=16,
        dtype=torch.float32,
        kv_dtype=torch.float32,
        device=triton_device,
        sliding_window_size=WINDOW,
        sinks=True,
    )
    backend = TritonAttnBackend(spec)
    h = PoolHarness(model, hf.config, attn_backend=backend, device=triton_device)
    check_logits(h, hf, decodes=4)  # the interpreter runs each kernel slowly
