"""GGUF files written the way llama.cpp's converter writes them (tensor names, q/k
row permutation for llama, rope_freqs for llama3 scaling, no output.weight when
tied), from tiny random HF models: our GGUF loader must give the HF model's logits.
The real quantized SmolLM2 GGUF is covered by test_gguf_loader.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

from radixlm.model.loader import load_model
from tests.checkpoints import add_llama_header
from tests.model.helpers import SMALL, PoolHarness, hf_logits, randomize

ATOL = 1e-4
CASES = {
    # arch: (config class, extra config, HF architecture)
    "llama": (
        "LlamaConfig",
        dict(
            max_position_embeddings=16384,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        "LlamaForCausalLM",
    ),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=False), "Qwen3ForCausalLM"),
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
    "post_attention_layernorm": "ffn_norm",
}


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _llama_cpp_rope_freqs(theta: float, dim: int, rs: dict) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (llama3 rope)
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    lo_wl = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
    hi_wl = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(rs["factor"])
        else:
            s = (rs["original_max_position_embeddings"] / wl - rs["low_freq_factor"]) / (
                rs["high_freq_factor"] - rs["low_freq_factor"]
            )
            out.append(1 / ((1 - s) / rs["factor"] + s))
    return np.array(out, dtype=np.float32)


def _write_gguf(
    path: str, arch: str, hf, cfg, matrix_type: str = "f32", raw_blocks: dict | None = None
) -> None:
    """matrix_type: how 2-D weights are stored, "f32", "f16" or "bf16" (as the converter's
    --outtype)."""
    import gguf

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(path, arch)
    add_llama_header(w, cfg)
    w.add_key_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    if cfg.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor(
            "rope_freqs.weight",
            _llama_cpp_rope_freqs(cfg.rope_parameters["rope_theta"], head_dim, cfg.rope_parameters),
        )
    add_hf_tensors(w, hf, cfg, arch, _NAMES, matrix_type=matrix_type, raw_blocks=raw_blocks)
    write_and_close(w)


def add_hf_tensors(
    w,
    hf,
    cfg,
    arch: str,
    names: dict,
    norm_offset: bool = False,
    matrix_type: str = "f32",
    raw_blocks: dict | None = None,
) -> None:
    """hf's weights under llama.cpp's names (names: HF module in a layer -> GGUF name), q/k rows
    permuted for the llama arch, norms stored as 1 + w where norm_offset (Gemma), 2-D weights as
    matrix_type ("f32", "f16" or "bf16", as the converter's --outtype). raw_blocks: GGUF name ->
    (uint8 blocks in the file's row order, GGMLQuantizationType) written instead of the HF
    tensor."""
    import gguf

    for name, t in hf.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        a = t.float().numpy().copy()
        if norm_offset and name.endswith("norm.weight"):
            a = a + 1
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers.") :].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            if arch == "llama" and module == "self_attn.q_proj":
                a = _llama_cpp_permute(a, cfg.num_attention_heads)
            elif arch == "llama" and module == "self_attn.k_proj":
                a = _llama_cpp_permute(a, cfg.num_key_value_heads)
            gname = f"blk.{layer}.{names[module]}.{kind}"
        else:
            gname = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        if raw_blocks and gname in raw_blocks:
            w.add_tensor(gname, raw_blocks[gname][0], raw_dtype=raw_blocks[gname][1])
        elif a.ndim == 2 and matrix_type == "f16":
            w.add_tensor(gname, a.astype(np.float16))
        elif a.ndim == 2 and matrix_type == "bf16":
            raw = torch.from_numpy(a).bfloat16().view(torch.uint8).numpy()
            w.add_tensor(
                gname, raw, raw_dtype=gguf.GGMLQuantizationType.BF16
            )  # bytes [rows, 2 cols]
        else:
            w.add_tensor(gname, a)


def write_and_close(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", list(CASES))
def test_gguf_arch_logits(arch, tmp_path):
    cfg_cls, extra, hf_arch = CASES[arch]
    cfg = getattr(transformers, cfg_cls)(**{**SMALL, **extra})
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    randomize(hf)
    path = str(tmp_path / f"{arch}.gguf")
    _write_gguf(path, arch, hf, cfg)

    loaded = load_model(path)
    c = loaded.hf_config
    assert loaded.architecture == hf_arch and loaded.eos_token_ids == [2]
    assert c.tie_word_embeddings == cfg.tie_word_embeddings
    assert c.rope_parameters.get("rope_type", "default") == cfg.rope_parameters.get(
        "rope_type", "default"
    )
    h = PoolHarness(loaded.model, c)
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, SMALL["vocab_size"], (n,), generator=g).tolist() for n in (12, 7)]
    reqs = [h.new_request() for _ in seqs]
    outs = h.extend(reqs, [s[:-1] for s in seqs])
    outs = [torch.cat([o, d[None]]) for o, d in zip(outs, h.decode(reqs, [s[-1] for s in seqs]))]
    for s, o in zip(seqs, outs):
        ref = hf_logits(hf, s)
        diff = (o - ref).abs().max().item()
        print(f"gguf {arch}: max|diff| {diff:.2e} (max|logit| {ref.abs().max():.1f})")
        assert diff < ATOL
