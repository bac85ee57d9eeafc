"""Sliding-window attention and logit soft-capping through whole models: Mistral with a real
window, Gemma 2 (alternating local/global layers, attention and final soft-caps) and Gemma 3 (q/k
norms, a RoPE per layer type), tiny random models with a window shorter than the prompts. Loaded
from safetensors (save_pretrained) and from a GGUF written the way llama.cpp's converter writes
it (Gemma norms stored as 1 + w, fixed layer patterns, q/k permuted for llama), our logits must be
transformers' (fp32), through prefill, chunked extend and batched decode over the KV pool, on the
torch and the native attention backend, and 32 greedy tokens must be HF generate's."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm.model.layers.attention import NativeCPUBackend
from radixlm.model.loader import load_model
from tests.model.helpers import SMALL, PoolHarness, hf_logits, randomize
from tests.model.test_gguf_archs import add_hf_tensors, write_and_close

ATOL = 1e-4
WINDOW = 8
GEMMA = dict(
    SMALL,
    head_dim=32,
    sliding_window=WINDOW,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)
CASES = {
    # name: (config class, config, GGUF arch or None)
    "mistral-swa": (
        "MistralConfig",
        dict(SMALL, sliding_window=WINDOW, tie_word_embeddings=False),
        "llama",
    ),
    # llama.cpp's Gemma 2 layers: even ones local; attention scale head_dim ** -0.5 (below 27B).
    "gemma2": (
        "Gemma2Config",
        dict(
            GEMMA,
            num_hidden_layers=3,
            query_pre_attn_scalar=32,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=4.0,
        ),
        "gemma2",
    ),
    # a scale llama.cpp cannot write (safetensors only)
    "gemma2-scalar": (
        "Gemma2Config",
        dict(
            GEMMA,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=None,
        ),
        None,
    ),
    # llama.cpp's Gemma 3 layers: 5 local, then a global one; local RoPE base 10000.
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            GEMMA,
            num_hidden_layers=6,
            query_pre_attn_scalar=32,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        ),
        "gemma3",
    ),
}
ARCH = {
    "MistralConfig": "MistralForCausalLM",
    "Gemma2Config": "Gemma2ForCausalLM",
    "Gemma3TextConfig": "Gemma3ForCausalLM",
}
_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
}
_LLAMA_NAMES = dict(_NAMES, post_attention_layernorm="ffn_norm")
_GEMMA_NAMES = dict(
    _NAMES,
    post_attention_layernorm="post_attention_norm",
    pre_feedforward_layernorm="ffn_norm",
    post_feedforward_layernorm="post_ffw_norm",
)


def _write_gguf(path: str, arch: str, hf, cfg) -> None:
    """What convert_hf_to_gguf.py writes for these (LlamaModel, Gemma2Model, Gemma3Model)."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_embedding_length(cfg.hidden_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    w.add_sliding_window(cfg.sliding_window)
    w.add_eos_token_id(1)
    if arch == "llama":
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if arch == "gemma2":  # Gemma2Model writes no rope base (llama.cpp's default 10000 = HF's)
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if (
        arch == "gemma3"
    ):  # the global layers' base and scaling; the local base is llama.cpp's fixed 10000
        full = cfg.rope_parameters["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    # llama.cpp stores Gemma's norm weights as 1 + w
    add_hf_tensors(
        w,
        hf,
        cfg,
        arch,
        _LLAMA_NAMES if arch == "llama" else _GEMMA_NAMES,
        norm_offset=arch != "llama",
    )
    write_and_close(w)


@pytest.fixture(
    scope="module",
    params=[
        (c, kind)
        for c in CASES
        for kind in ("safetensors", "gguf")
        if kind == "safetensors" or CASES[c][2]
    ],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def models(request, tmp_path_factory):
    name, kind = request.param
    cfg_cls, kw, gguf_arch = CASES[name]
    config = getattr(transformers, cfg_cls)(**kw)
    config.architectures = [ARCH[cfg_cls]]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    randomize(hf)
    hf.eval()
    path = tmp_path_factory.mktemp(name)
    if kind == "gguf":
        path = path / f"{name}.gguf"
        _write_gguf(str(path), gguf_arch, hf, config)
    else:
        hf.save_pretrained(path)
    loaded = load_model(str(path))
    assert loaded.architecture == ARCH[cfg_cls]
    return f"{name} {kind}", hf, loaded


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, SMALL["vocab_size"], (n,), generator=g).tolist() for n in lengths]


def _check(name: str, ours: torch.Tensor, ref: torch.Tensor) -> None:
    diff = (ours - ref).abs().max().item()
    print(f"{name}: max|diff| {diff:.2e} (max|logit| {ref.abs().max():.2f})")
    assert ref.abs().max() > 1.0, "logits too small for ATOL to mean anything"
    assert diff < ATOL, f"{name}: max abs logit diff {diff:.3e} >= {ATOL}"


def test_windowed_layers_are_windowed(models):
    name, hf, loaded = models
    windows = [layer.self_attn.attn.sliding_window_size for layer in loaded.model.model.layers]
    expect = [
        WINDOW if t == "sliding_attention" else None
        for t in (
            getattr(hf.config, "layer_types", None)
            or ["sliding_attention"] * hf.config.num_hidden_layers
        )
    ]
    assert windows == expect and WINDOW in windows and (None in windows) == name.startswith("gemma")


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_logits_prefill_chunked_extend_and_decode(models, backend):
    """Prompts longer than the window: one prefill, one extend in two chunks (the second over the
    first's KV), then batched decode steps; every position's logits are HF's for the whole sequence.
    """
    name, hf, loaded = models
    attn = NativeCPUBackend() if backend == "native" else None  # None: the harness's torch SDPA
    h = PoolHarness(loaded.model, loaded.hf_config, seed=3, attn_backend=attn)
    steps = 4
    seqs = _prompts([21 + steps, 13 + steps], seed=4)
    refs = [hf_logits(hf, s) for s in seqs]
    a, b = h.new_request(), h.new_request()
    oa, ob = h.extend([a, b], [seqs[0][:10], seqs[1][:13]])
    _check(f"{name} prefill", oa, refs[0][:10])
    _check(f"{name} prefill", ob, refs[1][:13])
    (oa,) = h.extend([a], [seqs[0][10:21]])
    _check(f"{name} extend over a prefix", oa, refs[0][10:21])
    for step in range(steps):
        pos = [21 + step, 13 + step]
        out = h.decode([a, b], [s[p] for s, p in zip(seqs, pos, strict=True)])
        _check(
            f"{name} decode step {step}",
            out,
            torch.stack([r[p] for r, p in zip(refs, pos, strict=True)]),
        )


def test_greedy_32_tokens_match_hf_generate(models):
    name, hf, loaded = models
    (prompt,) = _prompts([19], seed=5)
    hf.generation_config.eos_token_id = None  # 32 tokens whatever comes (as ours below)
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0)[
        0, len(prompt) :
    ]
    ref = ref.tolist()
    assert len(ref) == 32
    h = PoolHarness(loaded.model, loaded.hf_config, seed=6)
    r = h.new_request()
    (logits,) = h.extend([r], [prompt])
    out = [int(logits[-1].argmax())]
    while len(out) < 32:
        out.append(int(h.decode([r], [out[-1]])[0].argmax()))
    assert out == ref, f"{name}: greedy tokens differ from HF generate"


def test_runner_picks_native_and_tells_torch(tmp_path):
    """Auto builds the native backend on CPU (it takes each layer's window and cap per call); asked
    for, the torch backend is built with the model's window and cap."""
    from radixlm.model.executor.runner import ModelRunner
    from radixlm.model.executor.runner_config import ModelRunnerConfig
    from radixlm.model.layers.attention import TorchSDPABackend

    cfg_cls, kw, _ = CASES["gemma2"]
    config = getattr(transformers, cfg_cls)(**kw)
    config.architectures = [ARCH[cfg_cls]]
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(
        tmp_path
    )
    common = dict(
        model_path=str(tmp_path),
        max_total_tokens=512,
        max_running_requests=4,
        num_threads=torch.get_num_threads(),
    )
    assert type(ModelRunner(ModelRunnerConfig(**common)).attn_backend) is NativeCPUBackend
    backend = ModelRunner(ModelRunnerConfig(attention_backend="torch", **common)).attn_backend
    assert type(backend) is TorchSDPABackend
    assert (backend.sliding_window_size, backend.logit_cap) == (WINDOW, 3.0)
