"""Tests that need a CUDA GPU (pytest -m cuda): each module marks its tests `cuda` and skips them,
with the reason, where torch.cuda.is_available() is false (CUDA below). tests/triton runs the
kernels compiled on such a machine.

Their model is a random one with SmolLM2's tokenizer and a real architecture (Llama, GQA 4, head_dim
64), built where the test runs: the default model's 98 MB file does not fit in what a call to a lent
GPU machine carries (64 MiB), its tokenizer does (RADIXLM_GPU_TOKENIZER names a saved copy:
benchmarks/gpu_wheels.sh writes one; else the default model's, where it is installed). Its small
initial weights (std 0.02) keep bfloat16's error an order below the top-2 gaps of most steps. The
reference is HF transformers in float32 on the CPU, greedy, with its logits along the way."""

import os

import pytest
import torch

CUDA = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())"
    ),
]

PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a small village by the mountains,",
    "1, 1, 2, 3, 5, 8, 13,",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Translate 'good morning, my friend' into Spanish.",
]
NEW_TOKENS = 32
SP = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}


def load_gpu_tokenizer():
    from transformers import AutoTokenizer

    path = os.environ.get("RADIXLM_GPU_TOKENIZER")
    if path:
        return AutoTokenizer.from_pretrained(path)
    from radixlm.model.loader import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def gpu_model(tmp_path_factory):
    """(model dir, prompts' token ids, HF greedy references: (ids, generated, logits per step))."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_gpu_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.02,
    )
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("gpu-model")
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    refs = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = tok.encode(p)
            out = hf.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
            gen = out[0, len(ids) :].tolist()
            refs.append(
                (ids, gen, hf(out).logits[0, len(ids) - 1 :].float())
            )  # row k predicts gen[k]
    return str(path), refs
