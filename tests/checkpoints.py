"""Checkpoints for the weight-update tests: tiny random HF Llamas shaped like the `tiny_model_dir`
fixture (other seeds, or another shape / architecture), a damaged copy, and the same weights as a
GGUF file with Q8_0 matrices (written as llama.cpp's converter does)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import torch


def tiny_like(
    src: str, dst: str, seed: int, architecture: str = "LlamaForCausalLM", **changes
) -> str:
    """A random model with src's config (plus `changes`) and tokenizer, drawn with `seed`."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(src)
    if architecture != "LlamaForCausalLM":  # e.g. Qwen2ForCausalLM: the same sizes, another family
        family = architecture.removesuffix("ForCausalLM")
        cfg = getattr(transformers, f"{family}Config")(
            **{k: v for k, v in cfg.to_dict().items() if k not in ("architectures", "model_type")}
        )
    for k, v in changes.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(cfg).eval()
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def damaged_copy(src: str, dst: str) -> str:
    """src with its safetensors cut in half: the config reads, the weights do not."""
    shutil.copytree(src, dst)
    file = os.path.join(dst, "model.safetensors")
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) // 2)
    return dst


def safetensors_tensor(model_dir: str, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name).float()


def add_llama_header(w, cfg) -> None:
    """A llama GGUF's hyperparameters from a HF LlamaConfig."""
    for add, value in [
        (w.add_context_length, cfg.max_position_embeddings),
        (w.add_block_count, cfg.num_hidden_layers),
        (w.add_feed_forward_length, cfg.intermediate_size),
        (w.add_embedding_length, cfg.hidden_size),
        (w.add_head_count, cfg.num_attention_heads),
        (w.add_head_count_kv, cfg.num_key_value_heads),
        (w.add_layer_norm_rms_eps, cfg.rms_norm_eps),
        (w.add_rope_freq_base, cfg.rope_parameters["rope_theta"]),
        (w.add_vocab_size, cfg.vocab_size),
        (w.add_eos_token_id, 2),
    ]:
        add(value)


def q8_0_gguf(model_dir: str, path: str) -> str:
    """model_dir's weights as a llama GGUF file, every matrix in Q8_0 blocks (norms in float32)."""
    import gguf
    from gguf.quants import quantize
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.model.test_gguf_archs import _NAMES, add_hf_tensors, write_and_close

    cfg = AutoConfig.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    w = gguf.GGUFWriter(path, "llama")
    add_llama_header(w, cfg)

    # add_hf_tensors' writer: each matrix quantized on its way in (after the q/k permutation)
    class Q8Writer:
        def add_tensor(self, name, a, raw_dtype=None):
            if a.ndim == 2:
                w.add_tensor(
                    name,
                    quantize(np.ascontiguousarray(a), gguf.GGMLQuantizationType.Q8_0),
                    raw_dtype=gguf.GGMLQuantizationType.Q8_0,
                )
            else:
                w.add_tensor(name, a)

    add_hf_tensors(Q8Writer(), hf, cfg, "llama", _NAMES)
    write_and_close(w)
    return path
