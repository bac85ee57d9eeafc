"""A tiny random float32 gpt-oss checkpoint (HF GptOssForCausalLM) for the model and kernel tests:
4 layers alternating sliding (window WINDOW) and full attention, 4 heads over 2 KV heads of 16
dims, 4 experts top-2, YaRN RoPE as the released models configure it (truncate False), and sinks
drawn N(0, 1) (HF's init draws them at the initializer's 0.02, where ignoring them would hardly
show), the same weights as llama.cpp's converter writes them to GGUF, and the logits check both
attention backends' tests run on it."""

from __future__ import annotations

import random

import torch
import transformers

from tests.model.gguf_moe_writer import add_text_header
from tests.model.helpers import PoolHarness, hf_logits
from tests.model.hybrid_checkpoints import _add_vocab
from tests.model.test_gguf_archs import write_and_close
from tests.model.windowed_checkpoints import VOCAB, WINDOW, checkpoint

ATOL = 1e-4  # float32, as tests/model/test_logits.py

ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150_000.0,
    "factor": 2.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 128,
}


def _draw_sinks(hf: transformers.PreTrainedModel) -> None:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=g))


def gpt_oss_checkpoint(path: str, **config) -> transformers.PreTrainedModel:
    """The model saved at path with the tiny tokenizer; returns transformers' model. config:
    overrides of the tiny config."""
    return checkpoint(
        "GptOssConfig",
        "GptOssForCausalLM",
        path,
        init=_draw_sinks,
        sliding_window=WINDOW,
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=16,
        rope_parameters=dict(ROPE),
        **config,
    )


def check_logits(h: PoolHarness, hf: transformers.PreTrainedModel, decodes: int = 12) -> None:
    """A prompt of 18 tokens prefilled, `decodes` tokens decoded one by one, and a second request
    extending over the first one's cached prefix: every row's logits are transformers'. Every step
    crosses the window."""
    rng = random.Random(3)
    ids = [rng.randrange(10, VOCAB) for _ in range(18 + decodes)]
    ref = hf_logits(hf, ids)
    a = h.new_request()
    rows = [h.extend([a], [ids[:18]])[0]]
    rows += [h.decode([a], [t]) for t in ids[18:]]
    diff = (torch.cat(rows).cpu() - ref).abs().max().item()
    assert diff < ATOL, f"prefill + decode: max|diff| {diff:.2e}"
    tail = [rng.randrange(10, VOCAB) for _ in range(9)]
    b = h.new_request(share_prefix_of=a, prefix_len=16)
    got = h.extend([b], [tail])[0].cpu()
    diff = (got - hf_logits(hf, ids[:16] + tail)[16:]).abs().max().item()
    assert diff < ATOL, f"extend over a shared prefix: max|diff| {diff:.2e}"


def write_gguf(
    hf: transformers.PreTrainedModel,
    tokenizer_dir: str,
    path: str,
    experts: str | None = None,
    attention: str | None = None,
) -> str:
    """hf as llama.cpp's converter writes it (float32; convert_hf_to_gguf.py GptOssModel): gate and
    up experts de-interleaved into ffn_gate_exps / ffn_up_exps [E, inter, hidden] with split
    biases, down transposed to [E, hidden, inter], the sinks as attn_sinks.weight. experts: a GGML
    type name for the three expert weights (MXFP4 as the released GGUFs store them), quantized by
    gguf.quants; None: float32. attention: the same for the q/k/v/o matrices (Q8_0 as the released
    GGUFs store them)."""
    import gguf
    from gguf.quants import quantize

    def add(w: gguf.GGUFWriter, name: str, a: torch.Tensor, qtype_name: str | None) -> None:
        a = a.contiguous().numpy()
        if qtype_name is None:
            w.add_tensor(name, a.copy())
            return
        qtype = gguf.GGMLQuantizationType[qtype_name]
        w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)

    def expert(w: gguf.GGUFWriter, name: str, a: torch.Tensor) -> None:
        add(w, name, a, experts)

    cfg = hf.config
    arch = gguf.MODEL_ARCH.GPT_OSS
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    add_text_header(w, cfg, cfg.num_hidden_layers)
    w.add_rope_freq_base(ROPE["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(ROPE["factor"])
    w.add_rope_scaling_orig_ctx_len(ROPE["original_max_position_embeddings"])
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_sliding_window(cfg.sliding_window)
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        a = t.float()
        if ".mlp.experts." in name:
            blk = "blk." + name.split(".")[2]
            if name.endswith("gate_up_proj_bias"):
                w.add_tensor(f"{blk}.ffn_gate_exps.bias", a[..., ::2].numpy().copy())
                w.add_tensor(f"{blk}.ffn_up_exps.bias", a[..., 1::2].numpy().copy())
            elif name.endswith("gate_up_proj"):
                a = a.transpose(-1, -2)
                expert(w, f"{blk}.ffn_gate_exps.weight", a[:, ::2])
                expert(w, f"{blk}.ffn_up_exps.weight", a[:, 1::2])
            elif name.endswith("down_proj_bias"):
                w.add_tensor(f"{blk}.ffn_down_exps.bias", a.numpy().copy())
            else:
                expert(w, f"{blk}.ffn_down_exps.weight", a.transpose(-1, -2))
            continue
        if name.endswith(".sinks"):
            name += ".weight"
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        projection = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
        add(w, gguf_name, a, attention if gguf_name.endswith(projection) else None)
    write_and_close(w)
    return path
