"""Phi3ForCausalLM against transformers on tiny random models, loaded from safetensors and from a
GGUF written the way llama.cpp's converter (Phi3MiniModel) writes it: fused attn_qkv and ffn_up,
no q/k permutation, rope.dimension_count = the rotary width, longrope factors as tensors.

The longrope model has original_max_position_embeddings 64, so prompts and generations cross it:
transformers switches to the long factors when a forward's sequence is longer than that."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

from radixlm.model.forward_batch import ForwardMode
from radixlm.model.layers.rotary import get_rope
from radixlm.model.loader import load_model
from tests.model.helpers import SMALL, PoolHarness, hf_logits, randomize

ATOL = 1e-4
ORIG = 64  # original_max_position_embeddings of the longrope model


def _longrope(rotary_dim: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = rotary_dim // 2
    return {
        "rope_type": "longrope",
        "short_factor": (1 + 0.5 * torch.rand(n, generator=g)).tolist(),
        "long_factor": (1 + 7 * torch.rand(n, generator=g)).tolist(),
    }


CONFIGS = {
    # partial_rotary_factor as Phi-4-mini: head_dim 16, 12 rotary dims
    "longrope": dict(
        partial_rotary_factor=0.75,
        rope_scaling=_longrope(12, 0),
        original_max_position_embeddings=ORIG,
        sliding_window=None,
    ),
    # a window no shorter than the context changes nothing (Phi-3.5's is 262144)
    "plain": dict(sliding_window=SMALL["max_position_embeddings"], rope_theta=50000.0),
}


def _phi3_config(name: str) -> transformers.Phi3Config:
    cfg = transformers.Phi3Config(
        **{**SMALL, **CONFIGS[name]},
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["Phi3ForCausalLM"]
    return cfg


# -- the GGUF llama.cpp's convert_hf_to_gguf.py (Phi3MiniModel) writes -------------------------

_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GGUF_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_phi3_gguf(path: str, hf, cfg, quantize: dict | None = None) -> None:
    """quantize: GGUF module name (attn_qkv, ...) -> GGMLQuantizationType to store it in."""
    import gguf

    rp = cfg.rope_parameters
    orig = rp.get("original_max_position_embeddings", cfg.original_max_position_embeddings)
    rope_dims = (
        int(rp.get("partial_rotary_factor", 1.0) * cfg.hidden_size) // cfg.num_attention_heads
    )
    w = gguf.GGUFWriter(path, "phi3")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_sliding_window(cfg.sliding_window or 0)
    w.add_vocab_size(cfg.vocab_size)
    w.add_eos_token_id(2)
    if rp.get("long_factor"):
        scale = cfg.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        )
        w.add_tensor("rope_factors_long.weight", np.array(rp["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rp["short_factor"], dtype=np.float32))
    for name, t in hf.state_dict().items():
        a = t.float().numpy().copy()
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers.") :].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            gname = f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"
            qtype = (quantize or {}).get(_GGUF_NAMES[module])
            if qtype is not None:
                w.add_tensor(gname, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
                continue
        else:
            gname = _GGUF_TOP[name]
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# -- rotary -----------------------------------------------------------------------------------


def _batch(seq_lens: list[int], new_tokens: list[int]):
    """What cache_rows reads of a ForwardBatch."""
    mode = ForwardMode.DECODE if all(n == 1 for n in new_tokens) else ForwardMode.EXTEND
    return SimpleNamespace(
        forward_mode=mode,
        seq_lens_cpu=seq_lens,
        extend_seq_lens_cpu=new_tokens if mode.is_extend() else None,
    )


@pytest.mark.parametrize("partial", [1.0, 0.75])
def test_longrope_cos_sin_bitwise(partial):
    """Each request's cos/sin rows equal transformers' for that sequence alone, bit for bit, with
    short and long requests in one batch (extend, then decode)."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    head_dim = SMALL["hidden_size"] // SMALL["num_attention_heads"]
    rot = int(head_dim * partial)
    cfg = transformers.Phi3Config(
        **{
            **SMALL,
            **CONFIGS["longrope"],
            "partial_rotary_factor": partial,
            "rope_scaling": _longrope(rot, 3),
        }
    )
    ours, hf = get_rope(head_dim, cfg), Phi3RotaryEmbedding(cfg)
    assert ours.rotary_dim == rot

    def hf_cos_sin(positions: torch.Tensor) -> torch.Tensor:
        cos, sin = hf(torch.zeros(1, dtype=torch.float32), positions[None])
        assert torch.equal(cos[0, :, : rot // 2], cos[0, :, rot // 2 :])  # the halves repeat
        return torch.cat((cos[0, :, : rot // 2], sin[0, :, : rot // 2]), dim=-1)

    # extend: prefixes 0, 0, 10, 60 and lengths on both sides of ORIG (64: short, 65: long)
    prefix, new = [0, 0, 10, 60], [ORIG, ORIG + 1, 90, 4]
    seq = [p + n for p, n in zip(prefix, new, strict=True)]
    positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq, strict=True)])
    rows = ours.cache_rows(positions, _batch(seq, new))
    got = ours.cos_sin_cache[rows].split(new)
    for p, s, g in zip(prefix, seq, got, strict=True):
        # transformers sees one sequence of length s; its last tokens are ours
        ref = hf_cos_sin(torch.arange(s))[p:]
        assert torch.equal(g, ref), f"seq_len {s}"
    # decode: one token each at positions ORIG - 1 (short) and ORIG (first long) and beyond
    seq = [ORIG, ORIG + 1, 200]
    rows = ours.cache_rows(torch.tensor([s - 1 for s in seq]), _batch(seq, [1, 1, 1]))
    for s, g in zip(seq, ours.cos_sin_cache[rows], strict=True):
        assert torch.equal(g, hf_cos_sin(torch.arange(s))[-1])
    # the two tables do differ, or the above proves nothing
    assert not torch.equal(ours.cos_sin_cache[ORIG - 1], ours.cos_sin_cache[2 * ORIG - 1])


# -- the model --------------------------------------------------------------------------------


@pytest.fixture(
    scope="module",
    params=[(c, kind) for c in CONFIGS for kind in ("safetensors", "gguf")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def models(request, tmp_path_factory):
    name, kind = request.param
    cfg = _phi3_config(name)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    randomize(hf)
    path = tmp_path_factory.mktemp(f"phi3-{name}")
    if kind == "gguf":
        path = path / "model.gguf"
        write_phi3_gguf(str(path), hf, cfg)
    else:
        hf.save_pretrained(path)
    loaded = load_model(str(path))
    assert loaded.architecture == "Phi3ForCausalLM"
    c = loaded.hf_config
    assert c.rope_parameters["rope_type"] == cfg.rope_parameters["rope_type"]
    assert c.rope_parameters.get("partial_rotary_factor", 1.0) == cfg.rope_parameters.get(
        "partial_rotary_factor", 1.0
    )
    assert (
        c.sliding_window == cfg.sliding_window
        and loaded.context_len == SMALL["max_position_embeddings"]
    )
    return name, hf, loaded


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, SMALL["vocab_size"], (n,), generator=g).tolist() for n in lengths]


def test_logits_prefill_and_decode(models):
    """One extend batch of short (<= 64 tokens through decode) and long (> 64 from prefill)
    requests, then a decode step of all: every row equals transformers' on the whole sequence."""
    name, hf, loaded = models
    h = PoolHarness(loaded.model, loaded.hf_config)
    seqs = _prompts([12, 40, ORIG + 2, 90], seed=5)
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-1] for s in seqs])
    outs = [
        torch.cat([o, d[None]])
        for o, d in zip(outs, h.decode(reqs, [s[-1] for s in seqs]), strict=True)
    ]
    for s, o in zip(seqs, outs, strict=True):
        ref = hf_logits(hf, s)
        diff = (o - ref).abs().max().item()
        print(f"phi3 {name} len {len(s)}: max|diff| {diff:.2e} (max|logit| {ref.abs().max():.1f})")
        assert ref.abs().max() > 1.0
        assert diff < ATOL


def _greedy(loaded, prompts: list[list[int]], n: int = 32) -> list[list[int]]:
    """Our greedy tokens, all requests prefilled in one batch and decoded together."""
    h = PoolHarness(loaded.model, loaded.hf_config)
    reqs = [h.new_request() for _ in prompts]
    tokens = [[int(o[-1].argmax())] for o in h.extend(reqs, prompts)]
    for _ in range(n - 1):
        for t, nxt in zip(
            tokens, h.decode(reqs, [t[-1] for t in tokens]).argmax(-1).tolist(), strict=True
        ):
            t.append(nxt)
    return tokens


def test_greedy_matches_generate(models):
    """32 greedy tokens equal transformers' generate for a prompt that stays within the original
    context (20 + 32 <= 64: short factors) and one past it from the start (70: long), decoded in
    one batch."""
    name, hf, loaded = models
    prompts = _prompts([20, 70], seed=6)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    with torch.no_grad():
        ref = [
            hf.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]
    assert _greedy(loaded, prompts) == ref


def test_greedy_crossing_the_original_context(models):
    """A generation that crosses the original context (48 + 32 > 64) equals transformers stepping
    with its KV cache: the keys cached so far keep their factors, the new tokens take the long ones.
    (transformers' generate instead recomputes the whole sequence once at the crossing, which
    Phi3ForCausalLM's docstring explains radixlm does not do.)"""
    name, hf, loaded = models
    (prompt,) = _prompts([48], seed=7)
    cache, ref = transformers.DynamicCache(config=hf.config), []
    with torch.no_grad():
        ids = torch.tensor([prompt])
        for _ in range(32):
            ref.append(int(hf(ids, cache=cache, use_cache=True).logits[0, -1].argmax()))
            ids = torch.tensor([[ref[-1]]])
    assert len(prompt) + 31 > ORIG
    assert _greedy(loaded, [prompt]) == [ref]


def test_sliding_window_from_gguf(tmp_path):
    """Phi-3-mini-4k's window (2047 < 4096) is read from the GGUF and reaches every layer's
    attention: a prompt longer than the window gives transformers' logits (which apply it too)."""
    cfg = _phi3_config("plain")
    cfg.sliding_window = 16
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    path = str(tmp_path / "window.gguf")
    write_phi3_gguf(path, hf, cfg)
    loaded = load_model(path)
    assert (
        loaded.hf_config.sliding_window == 16 and loaded.context_len == cfg.max_position_embeddings
    )
    assert {layer.self_attn.attn.sliding_window_size for layer in loaded.model.model.layers} == {16}
    (seq,) = _prompts([40], seed=8)
    h = PoolHarness(loaded.model, loaded.hf_config)
    req = h.new_request()
    (out,) = h.extend([req], [seq[:-1]])
    out = torch.cat([out, h.decode([req], [seq[-1]])])
    ref = hf_logits(hf, seq)
    assert (out - ref).abs().max().item() < ATOL


def test_quantized_fused_tensors_stay_whole(tmp_path):
    """A Q8_0 GGUF kept quantized: attn_qkv and ffn_up are cut into shards at load and put back
    together as one quantized matrix (one kernel call, the fused-layers op applies) holding
    exactly the file's blocks."""
    import gguf
    from gguf.quants import dequantize

    from radixlm import kernels

    # CI machines have g++ and AVX2 (tests/kernels/conftest.py): a build failure fails, never skips.
    assert kernels.available(), (
        f"native kernels failed to build/load: {kernels.unavailable_reason()}"
    )
    cfg = _phi3_config("longrope")
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    randomize(hf)
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = str(tmp_path / "q8.gguf")
    write_phi3_gguf(path, hf, cfg, quantize={"attn_qkv": q8, "ffn_up": q8})
    loaded = load_model(path, quantization="gguf")
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    for layer in range(cfg.num_hidden_layers):
        block = loaded.model.model.layers[layer]
        for module, gname in (
            (block.self_attn.qkv_proj, "attn_qkv"),
            (block.mlp.gate_up_proj, "ffn_up"),
        ):
            q = module.qweight
            assert q is not None and len(q.segments) == 1 and q.formats[0].startswith("q8_0")
            t = tensors[f"blk.{layer}.{gname}.weight"]
            assert torch.equal(q.dequantize(), torch.from_numpy(dequantize(t.data, q8)).float())
