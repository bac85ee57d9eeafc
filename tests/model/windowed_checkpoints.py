"""Tiny float32 checkpoints of the Llama-like families with per-layer attention kinds (SmolLM3's
NoPE layers, OLMo 3's sliding windows) for the end-to-end tests: transformers' random model saved
beside a small BPE tokenizer, the same weights as llama.cpp's converter writes them to GGUF, and
the Engine check that radixlm's greedy tokens are HF's (near-tie rule) alone, batched and in
prefill chunks smaller than the prompt."""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable

import numpy as np
import torch
import transformers

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import _add_vocab, tiny_tokenizer

WINDOW = 8  # sliding layers' window: every prompt and answer below crosses it
CHUNK = 16  # prefill chunk: the longer prompts take 2-4
NEW = 16  # answers twice the window
VOCAB = 800  # the tiny tokenizer's ordinary tokens
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)


def checkpoint(
    config_cls: str,
    architecture: str,
    path: str,
    init: Callable[[transformers.PreTrainedModel], None] | None = None,
    **config,
) -> transformers.PreTrainedModel:
    """A random float32 HF model saved at path with the tiny tokenizer; returns the model. init:
    draws the family's own parameters after randomize (before saving)."""
    tok = tiny_tokenizer()
    cfg = getattr(transformers, config_cls)(
        **{**TINY, **config},
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,  # the families' defaults are ids of their own vocabularies
    )
    cfg.architectures = [architecture]
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(cfg).to(torch.float32)
    randomize(hf)
    if init is not None:
        init(hf)
    if not cfg.tie_word_embeddings:  # a tied head is the embedding, already of that spread
        with torch.no_grad():  # logits of a real model's spread (std ~8): choices far from ties
            hf.lm_head.weight.mul_(8)
    hf.eval().save_pretrained(path)
    tok.save_pretrained(path)
    return hf


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute: each head's rotary halves interleaved
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(hf, tokenizer_dir: str, path: str, arch: str) -> str:
    """hf as llama.cpp's converter writes it (float32): TextModel's header (the full-attention
    layers' RoPE base and scaling, the sliding ones' base), LlamaModel's q/k
    permutation for smollm3, Olmo2Model's window and per-layer pattern for olmo2."""
    import gguf

    cfg = hf.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters
    full = rope.get("full_attention", rope)
    w.add_rope_freq_base(full["rope_theta"])
    if "sliding_attention" in rope:
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if full["rope_type"] == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(full["factor"])
        w.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "smollm3":  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(head_dim)
    if arch == "olmo2" and getattr(cfg, "sliding_window", None):  # Olmo2Model's (OLMo 3)
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        a = t.float().numpy().copy()
        if arch == "smollm3" and name.endswith("q_proj.weight"):
            a = _permute(a, cfg.num_attention_heads)
        elif arch == "smollm3" and name.endswith("k_proj.weight"):
            a = _permute(a, cfg.num_key_value_heads)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference(hf, ids: list[int], new: int = NEW) -> tuple:
    """(ids, HF's `new` greedy tokens, HF's logits along them)."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=None
        )
        gen = out[0, len(ids) :].tolist()
        logits = hf(torch.tensor([ids + gen])).logits[0, len(ids) - 1 :]
    return ids, gen, logits


# HF model -> (prompts, references): a family's safetensors and GGUF checks share them.
_REFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _references(hf) -> tuple[list[list[int]], list[tuple]]:
    if hf not in _REFS:
        rng = random.Random(7)
        prompts = [[rng.randrange(10, VOCAB) for _ in range(n)] for n in (5, 20, 45, 33)]
        _REFS[hf] = prompts, [reference(hf, p) for p in prompts]
    return _REFS[hf]


def check_greedy(
    model_path: str, hf, label: str, attention_backend: str | None = None, **engine_args
) -> None:
    """Prompts of 5 to 45 tokens (all but the first longer than the window and the chunk), each
    alone and then all batched: radixlm's greedy tokens are HF's. attention_backend None: auto
    (the native kernel on CPU); engine_args: more of the Engine's options (pp_size)."""
    prompts, refs = _references(hf)
    sp = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
    with Engine(
        model_path=model_path,
        quantization="none",
        attention_backend=attention_backend,
        enable_invariant_checks=True,
        chunked_prefill_size=CHUNK,
        log_level="warning",
        **engine_args,
    ) as engine:
        for i, p in enumerate(prompts):
            assert engine.flush_cache()
            out = engine.generate(input_ids=p, sampling_params=sp)
            assert_greedy_equal(out["output_ids"], refs[i], f"{label} alone #{i}")
        assert engine.flush_cache()
        for i, out in enumerate(engine.generate(input_ids=prompts, sampling_params=sp)):
            assert_greedy_equal(out["output_ids"], refs[i], f"{label} batched #{i}")
