"""The native paged attention's per-layer features (sliding window, Llama 4's attention chunk,
attention sinks, logit soft-cap) against softcap.py's explicit attention in float64 with a window
(or chunk) mask, and their batch invariance: a windowed query's output is bitwise the same however
the batch is cut."""

import pytest
import torch

from radixlm.model.layers.attention.softcap import softcap_attention
from tests.kernels.test_attention import RTOL, Layout, SharedLayout

DTYPES = [torch.float32, torch.float16, torch.int8]


def run(ops, lay, q, reqs, q_lens, scale, window=0, sinks=None, cap=0.0, chunk=0):
    q_start = torch.zeros(len(reqs) + 1, dtype=torch.int64)
    q_start[1:] = torch.tensor(q_lens).cumsum(0)
    kb, vb = lay.pool.get_kv_buffer(0)
    ks, vs = lay.pool.get_kv_scales(0)
    return ops.paged_attention(
        q,
        kb,
        vb,
        ks,
        vs,
        lay.req_pool.req_to_token,
        torch.tensor([lay.rows[i] for i in reqs]),
        torch.tensor([lay.lens[i] for i in reqs]),
        q_start,
        scale,
        window,
        sinks,
        cap,
        chunk,
    )


def reference(q, k, v, scale, window, sinks, cap, chunk=0):
    """q [n, Hq, D]: the last n positions of a sequence with k/v [L, kvh, D]; HF's window (a
    query at p sees keys > p - window) or Llama 4's chunk (keys of p's chunk of `chunk`
    positions), in float64."""
    n, L, hq, kvh = q.shape[0], k.shape[0], q.shape[1], k.shape[1]
    pos, keys = torch.arange(L - n, L)[:, None], torch.arange(L)[None, :]
    mask = keys <= pos
    if window:
        mask &= keys > pos - window
    if chunk:
        mask &= keys // chunk == pos // chunk
    g = hq // kvh
    qh = q.double().view(n, kvh, g, -1).permute(1, 2, 0, 3).reshape(kvh, g * n, -1)
    kh, vh = k.double().transpose(0, 1), v.double().transpose(0, 1)
    s = None if sinks is None else sinks.double().view(kvh, g, 1, 1).expand(kvh, g, n, 1)
    o = softcap_attention(
        qh,
        kh,
        vh,
        mask.repeat(g, 1),
        scale,
        cap,
        None if s is None else s.reshape(kvh, g * n, 1),
    )
    return o.view(kvh, g, n, -1).permute(2, 0, 1, 3).reshape(n, hq, -1).float()


def check(lay, out, q, q_lens, scale, **features):
    off = 0
    for i, n in enumerate(q_lens):
        k, v = lay.stored(i)
        ref = reference(q[off : off + n], k, v, scale, **features)
        err = ((out[off : off + n] - ref).abs().max() / ref.abs().max()).item()
        assert err < RTOL, (
            f"request {i} ({lay.lens[i]} keys, {n} queries): relative error {err:.2e}"
        )
        off += n


FEATURES = {
    "window": dict(window=40, sinks=False, cap=0.0),
    "window-small": dict(window=5, sinks=False, cap=0.0),
    "window-large": dict(window=4096, sinks=False, cap=0.0),
    "sinks": dict(window=0, sinks=True, cap=0.0),
    "window+sinks": dict(window=33, sinks=True, cap=0.0),
    "softcap": dict(window=0, sinks=False, cap=3.0),
    "all": dict(window=20, sinks=True, cap=5.0),
    "chunk": dict(window=0, sinks=False, cap=0.0, chunk=32),
    "chunk-small": dict(window=0, sinks=False, cap=0.0, chunk=7),
    "chunk+sinks+softcap": dict(window=0, sinks=True, cap=4.0, chunk=24),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(FEATURES))
def test_matches_reference(kernel_ops, dtype, name):
    """Extend with and without a prefix, chunks, decode steps in one mixed batch; GQA 4 over 2."""
    f = FEATURES[name]
    lens = [1, 7, 33, 64, 95, 200, 130]
    lay = Layout(lens, 2, 64, dtype, seed=5)
    q_lens = [1, 7, 5, 64, 1, 37, 1]
    q = torch.randn(sum(q_lens), 4, 64, generator=lay.g) * 2
    sinks = torch.randn(4, generator=lay.g) * 3 if f["sinks"] else None
    scale = 64**-0.5
    chunk = f.get("chunk", 0)
    out = run(
        kernel_ops, lay, q, range(len(lens)), q_lens, scale, f["window"], sinks, f["cap"], chunk
    )
    check(lay, out, q, q_lens, scale, window=f["window"], sinks=sinks, cap=f["cap"], chunk=chunk)


@pytest.mark.parametrize("window", [1, 31, 32, 33, 70])
def test_shared_prefixes_windowed(kernel_ops, window):
    """Requests sharing cached prefixes (units read shared blocks once) with a window and sinks:
    against the reference, and each request bitwise what it gets alone."""
    prefixes = [270, 200, 270, 40, 200, 0, 100, 31, 256, 224]
    tails = [1, 5, 40, 1, 33, 20, 10, 1, 1, 1]
    q_lens = [1, 5, 40, 1, 3, 20, 60, 1, 1, 1]
    lay = SharedLayout(prefixes, tails, 2, 64, torch.float32, seed=13)
    q = torch.randn(sum(q_lens), 4, 64, generator=lay.g)
    sinks = torch.randn(4, generator=lay.g)
    scale = 0.125
    reqs = list(range(len(tails)))
    out = run(kernel_ops, lay, q, reqs, q_lens, scale, window, sinks)
    check(lay, out, q, q_lens, scale, window=window, sinks=sinks, cap=0.0)
    off = 0
    for i, n in enumerate(q_lens):
        alone = run(kernel_ops, lay, q[off : off + n].clone(), [i], [n], scale, window, sinks)
        assert torch.equal(alone, out[off : off + n]), f"request {i} differs beside the others"
        off += n


@pytest.mark.parametrize(
    "window, chunk", [(1, 0), (20, 0), (32, 0), (45, 0), (150, 0), (0, 32), (0, 45)]
)
@pytest.mark.parametrize("cap", [0.0, 4.0])
def test_windowed_batch_invariant(kernel_ops, window, chunk, cap):
    """One extend of 150 tokens, chunks of any size, decode steps (each of the last 40 queries
    alone), and beside other requests: bitwise equal (a window, or Llama 4's attention chunk)."""
    lay = Layout([150, 90, 13], 2, 64, torch.float32, seed=7)
    q_all = torch.randn(150, 4, 64, generator=lay.g)
    sinks = torch.randn(4, generator=lay.g)
    scale = 0.125

    def go(q, reqs, q_lens):
        return run(kernel_ops, lay, q, reqs, q_lens, scale, window, sinks, cap, chunk)

    full = go(q_all, [0], [150])
    for n in (2, 31, 32, 33, 100):
        assert torch.equal(go(q_all[-n:].clone(), [0], [n]), full[-n:]), f"chunk of {n} differs"
    for p in range(110, 150):  # decode steps: the request as it was at length p + 1
        lay.lens[0] = p + 1
        step = go(q_all[p : p + 1].clone(), [0], [1])
        assert torch.equal(step, full[p : p + 1]), f"decode step at {p} differs"
    lay.lens[0] = 150
    other = torch.randn(5, 4, 64, generator=lay.g)
    mixed = go(torch.cat([other[:4], q_all[-3:], other[4:]]), [1, 0, 2], [4, 3, 1])
    assert torch.equal(mixed[4:7], full[-3:])


def test_window_none_is_the_plain_kernel(kernel_ops):
    """window 0 / a window past the sequence / no sinks: bitwise the kernel without features."""
    lay = Layout([100, 20], 2, 64, torch.float32, seed=3)
    q = torch.randn(30, 4, 64, generator=lay.g)
    plain = run(kernel_ops, lay, q, [0, 1], [10, 20], 0.125)
    assert torch.equal(run(kernel_ops, lay, q, [0, 1], [10, 20], 0.125, 1000), plain)
    assert torch.equal(run(kernel_ops, lay, q, [0, 1], [10, 20], 0.125, 100), plain)


def test_bad_sinks(kernel_ops):
    lay = Layout([10], 2, 64, torch.float32, seed=1)
    q = torch.randn(1, 4, 64)
    with pytest.raises(RuntimeError, match="sinks"):
        run(kernel_ops, lay, q, [0], [1], 0.125, 0, torch.zeros(3))
    with pytest.raises(RuntimeError, match="window"):
        run(kernel_ops, lay, q, [0], [1], 0.125, -1)
    with pytest.raises(RuntimeError, match="a window or a chunk"):
        run(kernel_ops, lay, q, [0], [1], 0.125, 4, None, 0.0, 8)


def test_chunked_layers_run_on_the_native_backend_only():
    """Llama 4's chunked layers reach the spec (attention_features); auto picks native on CPU and
    the backends without chunked attention refuse it by name."""
    from radixlm.model.layers.attention import AttentionBackendSpec, attention_features
    from radixlm.model.layers.attention.radix_attention import RadixAttention
    from radixlm.model.layers.attention.registry import resolve_attention_backend

    layers = [RadixAttention(4, 64, 0.125, 2, i, attention_chunk_size=8192) for i in range(3)]
    layers.append(RadixAttention(4, 64, 0.125, 2, 3))  # a NoPE global layer: no chunk
    features = attention_features(layers)
    assert features.attention_chunk_size == 8192 and features.sliding_window_size is None
    spec = AttentionBackendSpec(
        64, torch.float32, torch.float32, torch.device("cpu"), attention_chunk_size=8192
    )
    assert resolve_attention_backend(None, spec) == "native"
    with pytest.raises(ValueError, match="chunked attention"):
        resolve_attention_backend("torch", spec)
    with pytest.raises(ValueError, match="window or an attention chunk"):
        RadixAttention(4, 64, 0.125, 2, 0, sliding_window_size=8, attention_chunk_size=8)
