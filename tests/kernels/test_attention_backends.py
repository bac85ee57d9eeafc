"""The attention backend registry (model/layers/attention/registry.py) and HybridAttnBackend: names
and auto selection, and a hybrid that sends prefill and decode batches to different backends gives
the logits of running each phase on its own backend, which match transformers'."""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest
import torch

from radixlm.model.forward_batch import ForwardMode
from radixlm.model.layers.attention import (
    ATTENTION_BACKENDS,
    AttentionBackendSpec,
    HybridAttnBackend,
    NativeCPUBackend,
    TorchSDPABackend,
    create_attention_backend,
)
from radixlm.model.layers.attention.decode_kv_mirror_path import DecodeKVMirrorPath
from radixlm.model.layers.attention.gather_decode_path import GatherDecodePath
from radixlm.model.layers.attention.native import NativeMetadata
from radixlm.model.layers.attention.shared_prefix_decode_path import SharedPrefixDecodePath
from radixlm.model.layers.attention.torch_sdpa import SDPAMetadata
from radixlm.model.layers.attention.triton_backend import TritonAttnBackend
from radixlm.model.loader import load_model
from tests.model.helpers import SMALL, PoolHarness, hf_logits, save_random_llama

ATOL = 1e-4  # as tests/model/test_logits.py
CPU = torch.device("cpu")


def spec(head_dim=16, dtype=torch.float32, kv_dtype=None, device=CPU, **kw) -> AttentionBackendSpec:
    return AttentionBackendSpec(
        head_dim=head_dim, dtype=dtype, kv_dtype=kv_dtype or dtype, device=device, **kw
    )


def test_names():
    assert ATTENTION_BACKENDS == ("native", "triton", "torch", "mla")


@pytest.mark.parametrize(
    "field", ["attention_backend", "prefill_attention_backend", "decode_attention_backend"]
)
def test_unknown_name_names_the_field(field):
    kw = {
        "attention_backend": dict(name="flash"),
        "prefill_attention_backend": dict(name=None, prefill="flash"),
        "decode_attention_backend": dict(name=None, decode="flash"),
    }[field]
    with pytest.raises(
        ValueError, match=f"^{field} must be one of native, triton, torch, mla, got 'flash'$"
    ):
        create_attention_backend(spec=spec(), **kw)


def test_auto_picks_native_on_cpu_float32(kernel_ops):
    assert type(create_attention_backend(None, spec())) is NativeCPUBackend
    # Native reads any KV dtype of the pool.
    assert type(create_attention_backend(None, spec(kv_dtype=torch.int8))) is NativeCPUBackend


@pytest.mark.parametrize("where", ["bfloat16", "head_dim 12", "head_dim 520"])
def test_auto_picks_torch_where_native_does_not_apply(kernel_ops, where):
    s = {
        "bfloat16": spec(dtype=torch.bfloat16),
        "head_dim 12": spec(head_dim=12),
        "head_dim 520": spec(head_dim=520),
    }[where]
    backend = create_attention_backend(None, s)
    assert type(backend) is TorchSDPABackend
    with pytest.raises(ValueError, match="^attention_backend native: "):
        create_attention_backend("native", s)


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (the test extra)"
)
def test_auto_picks_triton_on_cuda(kernel_ops, monkeypatch):
    """On CUDA auto's choice is the Triton backend (native says why not); on CPU the Triton kernels
    run only in Triton's interpreter (tests/triton), so naming it says so and auto passes it by."""
    monkeypatch.delenv(
        "TRITON_INTERPRET", raising=False
    )  # the test session turns it on without a GPU
    cuda = spec(device=torch.device("cuda"), dtype=torch.bfloat16)
    assert type(create_attention_backend(None, cuda)) is TritonAttnBackend
    assert type(create_attention_backend("torch", cuda)) is TorchSDPABackend
    with pytest.raises(ValueError, match="^attention_backend native: "):
        create_attention_backend("native", cuda)
    with pytest.raises(
        ValueError,
        match=r"^attention_backend triton: the Triton kernels run on CUDA \(on CPU only "
        r"under Triton's interpreter",
    ):
        create_attention_backend("triton", spec(dtype=torch.bfloat16))
    assert type(create_attention_backend(None, spec(dtype=torch.bfloat16))) is TorchSDPABackend
    why = "kv_cache_dtype int8: the Triton kernels read float KV"
    with pytest.raises(ValueError, match=f"^attention_backend triton: {why}$"):
        create_attention_backend("triton", spec(device=torch.device("cuda"), kv_dtype=torch.int8))


def test_torch_backend_is_built_from_the_spec():
    backend = create_attention_backend("torch", spec(shared_prefix=False, mirror_bytes=1 << 20))
    assert type(backend) is TorchSDPABackend
    assert [type(p) for p in backend.decode_paths] == [DecodeKVMirrorPath, GatherDecodePath]
    assert backend.decode_paths[0].max_bytes == 1 << 20
    backend = create_attention_backend("torch", spec(shared_prefix=True, mirror_bytes=0))
    assert [type(p) for p in backend.decode_paths] == [SharedPrefixDecodePath, GatherDecodePath]


@pytest.mark.parametrize(
    "feature", [dict(sliding_window_size=8), dict(logit_cap=50.0), dict(sinks=True)], ids=str
)
def test_windows_caps_and_sinks_run_native(kernel_ops, feature):
    """A model with windowed, soft-capped or sink layers: auto picks native (the kernel takes each
    layer's features per call); the torch backend asked for is built for them (the gather decode
    path alone, which knows the window)."""
    s = spec(mirror_bytes=1 << 20, **feature)
    assert type(create_attention_backend(None, s)) is NativeCPUBackend
    backend = create_attention_backend("torch", s)
    assert type(backend) is TorchSDPABackend
    assert [type(p) for p in backend.decode_paths] == [GatherDecodePath]
    assert backend.decode_paths[0].sliding_window_size == s.sliding_window_size
    assert (backend.sliding_window_size, backend.logit_cap) == (s.sliding_window_size, s.logit_cap)


def test_kv_dtype_other_than_the_model_dtype_needs_native(kernel_ops):
    why = "kv_cache_dtype int8 differs from the model dtype and needs the native attention backend"
    with pytest.raises(ValueError, match=f"^attention_backend torch: {why}$"):
        create_attention_backend("torch", spec(kv_dtype=torch.int8))
    with pytest.raises(ValueError, match=f"^decode_attention_backend torch: {why}$"):
        create_attention_backend(None, spec(kv_dtype=torch.int8), decode="torch")
    # auto, where native does not apply either: both reasons
    native_why = "the native attention kernel runs float32 models on CPU"
    with pytest.raises(
        ValueError, match=f"native: {native_why}; triton: auto picks it on cuda only; torch: {why}"
    ):
        create_attention_backend(None, spec(dtype=torch.bfloat16, kv_dtype=torch.int8))


def test_prefill_and_decode_names_make_a_hybrid(kernel_ops):
    h = create_attention_backend(None, spec(), prefill="torch")
    assert type(h) is HybridAttnBackend
    assert (
        type(h.prefill_backend) is TorchSDPABackend and type(h.decode_backend) is NativeCPUBackend
    )
    h = create_attention_backend("torch", spec(), decode="native")
    assert (
        type(h.prefill_backend) is TorchSDPABackend and type(h.decode_backend) is NativeCPUBackend
    )
    # The same backend for both phases is that backend alone.
    assert (
        type(create_attention_backend("torch", spec(), prefill="torch", decode="torch"))
        is TorchSDPABackend
    )
    assert type(create_attention_backend(None, spec(), prefill="native")) is NativeCPUBackend


# --- a hybrid through a model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random Llama (head_dim 16: native applies) saved as HF safetensors, and transformers'
    model."""
    path = tmp_path_factory.mktemp("hybrid-llama")
    hf, _ = save_random_llama(path)
    return hf, load_model(str(path)), str(path)


def counting(backend) -> Counter:
    """Count the calls of backend's per-batch methods (instance attributes wrap the real ones)."""
    calls: Counter = Counter()
    for name in (
        "init_forward_metadata",
        "forward_extend",
        "forward_decode",
        "runs_fused_layers",
        "reset",
    ):
        real = getattr(backend, name)

        def wrapper(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(backend, name, wrapper)
    return calls


PROMPTS = [[(7 * i + 3) % 256 for i in range(20)], [(11 * i + 5) % 256 for i in range(13)]]
STEPS = 3


def run_scenario(
    model, config, backends
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[int]]]:
    """Two prompts in one extend, a third request extending over the first one's cached prefix, then
    STEPS greedy decode steps of all three. backends: one backend, or (extend's, decode's) swapped
    in by hand before each batch. -> (extend logits per request, decode logits per step, sequences).
    """
    extend_backend, decode_backend = (
        backends if isinstance(backends, tuple) else (backends, backends)
    )
    h = PoolHarness(model, config, seed=7, attn_backend=extend_backend)
    a, b = h.new_request(), h.new_request()
    extends = h.extend([a, b], PROMPTS)
    c = h.new_request(share_prefix_of=a, prefix_len=12)
    seqs = [list(PROMPTS[0]), list(PROMPTS[1]), PROMPTS[0][:12] + [9, 8, 7, 6, 5]]
    extends += h.extend([c], [seqs[2][12:]])
    last = [extends[0][-1], extends[1][-1], extends[2][-1]]
    h.attn_backend = decode_backend
    decodes = []
    for _ in range(STEPS):
        tokens = [int(torch.argmax(x)) for x in last]
        for s, t in zip(seqs, tokens, strict=True):
            s.append(t)
        out = h.decode([a, b, c], tokens)
        decodes.append(out)
        last = list(out)
    return extends, decodes, seqs


@pytest.mark.parametrize("prefill,decode", [("torch", "native"), ("native", "torch")])
def test_hybrid_routes_prefill_and_decode(kernel_ops, tiny_llama, prefill, decode):
    hf, loaded, _ = tiny_llama
    torch.set_num_threads(2)
    s = spec(head_dim=loaded.hf_config.hidden_size // loaded.hf_config.num_attention_heads)
    hybrid = create_attention_backend(None, s, prefill=prefill, decode=decode)
    prefill_calls, decode_calls = counting(hybrid.prefill_backend), counting(hybrid.decode_backend)
    extends, decodes, seqs = run_scenario(loaded.model, loaded.hf_config, hybrid)

    layers = loaded.hf_config.num_hidden_layers
    assert (
        prefill_calls["forward_extend"] == 2 * layers
        and prefill_calls["init_forward_metadata"] == 2
    )
    assert (
        decode_calls["forward_decode"] == STEPS * layers
        and decode_calls["init_forward_metadata"] == STEPS
    )
    assert prefill_calls["forward_decode"] == decode_calls["forward_extend"] == 0
    assert (
        prefill_calls["init_forward_metadata"] + decode_calls["init_forward_metadata"] == 2 + STEPS
    )

    # Bitwise the logits of each phase run on its own backend (switched by hand between batches).
    by_hand = run_scenario(
        loaded.model,
        loaded.hf_config,
        (create_attention_backend(prefill, s), create_attention_backend(decode, s)),
    )
    assert all(torch.equal(x, y) for x, y in zip(extends, by_hand[0], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(decodes, by_hand[1], strict=True))
    assert seqs == by_hand[2]

    # The same greedy tokens as either backend alone, and transformers' logits.
    for single in ("torch", "native"):
        assert (
            run_scenario(loaded.model, loaded.hf_config, create_attention_backend(single, s))[2]
            == seqs
        )
    refs = [hf_logits(hf, ids) for ids in seqs]
    offsets = [0, 0, 12]
    for i, (out, ref) in enumerate(zip(extends, refs, strict=True)):
        torch.testing.assert_close(out, ref[offsets[i] : offsets[i] + len(out)], atol=ATOL, rtol=0)
    for step, out in enumerate(decodes):
        pos = [len(PROMPTS[0]) + step, len(PROMPTS[1]) + step, 17 + step]
        torch.testing.assert_close(
            out, torch.stack([r[p] for r, p in zip(refs, pos, strict=True)]), atol=ATOL, rtol=0
        )


def test_hybrid_routes_every_method_by_batch_shape(kernel_ops, tiny_llama, monkeypatch):
    """MIXED and TARGET_VERIFY are extend-shaped: the prefill backend's; DECODE the decode
    backend's."""
    _, loaded, _ = tiny_llama
    hybrid = create_attention_backend(None, spec(), prefill="native", decode="torch")
    resets = counting(hybrid.prefill_backend), counting(hybrid.decode_backend)
    h = PoolHarness(loaded.model, loaded.hf_config, attn_backend=hybrid)
    a, b = h.new_request(), h.new_request()
    h.extend([a, b], PROMPTS)
    seen = {}
    real_run = loaded.model.model.forward

    def recording(input_ids, positions, fb):
        out = real_run(input_ids, positions, fb)
        seen[fb.forward_mode] = (type(fb.attn_metadata), hybrid.runs_fused_layers(fb))
        return out

    monkeypatch.setattr(loaded.model.model, "forward", recording)
    h._run(ForwardMode.TARGET_VERIFY, [a], [[1, 2, 3]])
    h._run(ForwardMode.MIXED, [a, b], [[4, 5], [6]])
    h.decode([a, b], [7, 8])
    assert seen == {
        ForwardMode.TARGET_VERIFY: (NativeMetadata, True),
        ForwardMode.MIXED: (NativeMetadata, True),
        ForwardMode.DECODE: (SDPAMetadata, False),
    }
    hybrid.reset()
    assert [c["reset"] for c in resets] == [1, 1]


@pytest.fixture(scope="module")
def default_model():
    torch.set_num_threads(2)
    return load_model(None)  # the GGUF's own quantization: the fused decoder op applies


@pytest.mark.parametrize("prefill,decode", [("torch", "native"), ("native", "torch")])
def test_fused_layers_follow_the_phase_backend(
    kernel_ops, default_model, monkeypatch, prefill, decode
):
    """The model runs the native fused layers exactly for the batches the native backend runs."""
    from radixlm.model.layers.fused_layers import FusedLayers

    fused = Counter()
    real = FusedLayers.run

    def counted(
        f, hidden, positions, fb, *layers
    ):  # layers: a segment's (start, end), model/hidden_capture.py
        fused.update([fb.forward_mode])
        return real(f, hidden, positions, fb, *layers)

    monkeypatch.setattr(FusedLayers, "run", counted)
    head_dim = default_model.hf_config.hidden_size // default_model.hf_config.num_attention_heads
    s = spec(head_dim=head_dim)
    hybrid = create_attention_backend(None, s, prefill=prefill, decode=decode)
    model, config = default_model.model, default_model.hf_config
    got = run_scenario(model, config, hybrid)
    native_mode = ForwardMode.DECODE if decode == "native" else ForwardMode.EXTEND
    assert fused == Counter({native_mode: STEPS if decode == "native" else 2})
    by_hand = run_scenario(
        model, config, (create_attention_backend(prefill, s), create_attention_backend(decode, s))
    )
    assert all(
        torch.equal(x, y) for x, y in zip(got[0] + got[1], by_hand[0] + by_hand[1], strict=True)
    )


# --- through ModelRunner --------------------------------------------------------------------------


def make_runner(path: str, **options):
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig

    threads = torch.get_num_threads()  # the runner sets the process's torch threads; give them back
    try:
        return ModelRunner(
            ModelRunnerConfig(
                model_path=str(path),
                num_threads=1,
                max_total_tokens=512,
                max_running_requests=4,
                **options,
            )
        )
    finally:
        torch.set_num_threads(threads)


def greedy(
    runner, prompts: list[list[int]], steps: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill prompts in one batch, then `steps` greedy decode steps, straight on the runner."""
    from radixlm.model.executor.worker_batch import ModelWorkerBatch

    rows = [runner.req_to_token_pool.alloc() for _ in prompts]
    seqs, logits = [list(p) for p in prompts], []

    def step(mode, new: list[list[int]]) -> torch.Tensor:
        prefix = [len(s) - len(n) for s, n in zip(seqs, new, strict=True)]
        out = runner.token_to_kv_pool.alloc(sum(map(len, new)))
        start = 0
        for r, p, n in zip(rows, prefix, new, strict=True):
            runner.req_to_token_pool.req_to_token[r, p : p + len(n)] = out[start : start + len(n)]
            start += len(n)
        positions = [i for p, n in zip(prefix, new, strict=True) for i in range(p, p + len(n))]
        b = ModelWorkerBatch(
            mode,
            [t for n in new for t in n],
            positions,
            rows,
            [len(s) for s in seqs],
            out,
            extend_prefix_lens=prefix,
            extend_seq_lens=[len(n) for n in new],
        )
        return runner.forward(runner.prepare(b)).next_token_logits

    new = [list(p) for p in prompts]
    for i in range(steps + 1):
        out = step(ForwardMode.EXTEND if i == 0 else ForwardMode.DECODE, new)
        logits.append(out)
        new = [[int(t)] for t in out.argmax(-1)]
        for s, n in zip(seqs, new, strict=True):
            s += n
    return seqs, logits


def test_runner_builds_its_backend_from_the_config(kernel_ops, tiny_llama):
    path = tiny_llama[2]
    single = make_runner(path)
    assert type(single.attn_backend) is NativeCPUBackend
    hybrid = make_runner(path, prefill_attention_backend="torch")
    assert type(hybrid.attn_backend) is HybridAttnBackend
    calls = (
        counting(hybrid.attn_backend.prefill_backend),
        counting(hybrid.attn_backend.decode_backend),
    )
    torch_only = make_runner(path, attention_backend="torch")
    prompts = [[5, 9, 200, 17, 3, 3, 8], [100, 101, 102]]
    seqs, logits = greedy(hybrid, prompts, steps=3)
    ref_seqs, ref_logits = greedy(torch_only, prompts, steps=3)
    native_seqs, native_logits = greedy(single, prompts, steps=3)
    assert seqs == ref_seqs == native_seqs
    assert (
        logits[0].abs().max() > 1.0
    )  # peaked logits: ATOL means something, greedy is far from ties
    assert torch.equal(logits[0], ref_logits[0])  # the prefill ran on torch
    for step in range(1, 4):  # the decode steps on native
        torch.testing.assert_close(logits[step], native_logits[step], atol=ATOL, rtol=0)
    layers = SMALL["num_hidden_layers"]
    assert [(c["forward_extend"], c["forward_decode"]) for c in calls] == [
        (layers, 0),
        (0, 3 * layers),
    ]


def test_runner_kv_dtype(kernel_ops, tiny_llama):
    """auto: float16 KV for quantized weights where every backend reads it (native), else the
    model's."""
    path = tiny_llama[2]
    assert make_runner(path, quantization="int8").kv_dtype == torch.float16
    assert make_runner(path).kv_dtype == torch.float32
    assert (
        make_runner(path, quantization="int8", decode_attention_backend="torch").kv_dtype
        == torch.float32
    )
    assert make_runner(path, kv_cache_dtype="int8").token_to_kv_pool.dtype == torch.int8
    with pytest.raises(
        ValueError,
        match="^attention_backend torch: kv_cache_dtype int8 differs from the model dtype",
    ):
        make_runner(path, kv_cache_dtype="int8", attention_backend="torch")
