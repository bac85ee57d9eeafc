"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) through our GGUF loader vs
transformers' own GGUF loader: same config, same logits, same greedy tokens;
tokenizer and chat template; clear errors for bad paths.

Both sides dequantize with gguf's kernels, so weights are identical and the only
difference left is float32 op order (fused qkv/gate_up matmuls, SDPA kernels):
max |diff| observed ~4e-5 on logits of magnitude ~30-40, so ATOL = 1e-4 absolute
(~3e-6 relative) holds with 2x margin; any real bug (a wrong permutation, a
missing norm, a mask off by one) moves logits by >1e-1.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from radixlm.model.loader import default_model_path, load_model, load_model_config, load_tokenizer
from tests.model.helpers import PoolHarness, hf_logits

ATOL = 1e-4
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nWhat is 2+2? Answer briefly.<|im_end|>\n<|im_start|>assistant\n",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf_path():
    return default_model_path()  # the README installs it: a missing model is a failure, not a skip


@pytest.fixture(scope="module")
def ours(gguf_path):
    t0 = time.perf_counter()
    loaded = load_model(gguf_path, quantization="none")  # the HF reference dequantizes to fp32 too
    print(f"\nradixlm GGUF load: {time.perf_counter() - t0:.2f} s")
    return loaded


@pytest.fixture(scope="module")
def hf(hf_default_model):
    return hf_default_model()


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    return load_tokenizer(gguf_path)


def test_config(ours):
    c = ours.hf_config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (
        30,
        576,
        9,
        3,
    )
    assert (c.vocab_size, c.intermediate_size, c.head_dim) == (49152, 1536, 64)
    assert c.tie_word_embeddings and not hasattr(ours.model, "lm_head")
    assert ours.architecture == "LlamaForCausalLM"
    assert ours.context_len == 8192 and ours.eos_token_ids == [2]
    assert load_model_config(ours.model_path).to_dict() == c.to_dict()


def test_prefill_logits_match_hf(ours, hf, tokenizer):
    h = PoolHarness(ours.model, ours.hf_config)
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    outs = h.extend([h.new_request() for _ in ids], ids)
    for i, (seq, out) in enumerate(zip(ids, outs)):
        ref = hf_logits(hf, seq)
        diff = (out - ref).abs().max().item()
        print(
            f"gguf prefill[{i}] ({len(seq)} tokens): max|diff| {diff:.2e}, max|logit|"
            f" {ref.abs().max():.1f}"
        )
        assert diff < ATOL
        assert torch.equal(out.argmax(-1), ref.argmax(-1))


def test_greedy_decode_matches_hf(ours, hf, tokenizer):
    """Prefill two prompts together, then decode them as one ragged batch."""
    h = PoolHarness(ours.model, ours.hf_config)
    ids = [tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    reqs = [h.new_request() for _ in ids]
    last = [o[-1] for o in h.extend(reqs, ids)]
    seqs = [list(s) for s in ids]
    for _ in range(8):
        for s, lg in zip(seqs, last):
            s.append(int(lg.argmax()))
        last = list(h.decode(reqs, [s[-1] for s in seqs]))
    max_diff = 0.0
    for s, n, lg in zip(seqs, map(len, ids), last):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([s[:n]]), max_new_tokens=8, do_sample=False)[0].tolist()
        assert s == ref
        max_diff = max(max_diff, (lg - hf_logits(hf, s)[-1]).abs().max().item())
    print(f"gguf decode: max|diff| at the last step {max_diff:.2e}")
    assert max_diff < ATOL


def test_tokenizer_and_chat_template(ours, tokenizer):
    for text in TEXTS + ["héllo wörld 你好 🙂"]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert ours.chat_template and "<|im_start|>" in ours.chat_template
    assert tokenizer.chat_template == ours.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n") and "Hi" in prompt
    assert tokenizer.convert_ids_to_tokens(ours.eos_token_ids) == ["<|im_end|>"]


def test_tokenizer_cache(gguf_path, tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    first = load_tokenizer(gguf_path)  # converts from the GGUF and saves
    assert os.listdir(tmp_path / "tokenizers")
    t0 = time.perf_counter()
    second = load_tokenizer(gguf_path)
    print(f"\ncached tokenizer load: {time.perf_counter() - t0:.2f} s")
    text = "A cached tokenizer must tokenize the same. <|im_end|>"
    assert first(text)["input_ids"] == second(text)["input_ids"]
    assert second.chat_template == first.chat_template


def test_missing_path(tmp_path):
    missing = str(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_model(missing)
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_tokenizer(missing)


def test_bad_files(tmp_path, gguf_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"this is not a gguf file at all")
    with pytest.raises(ValueError, match="not a GGUF"):
        load_model(str(bad))
    truncated = tmp_path / "truncated.gguf"
    with open(gguf_path, "rb") as f:
        truncated.write_bytes(f.read(100_000))  # header cut mid-vocabulary
    with pytest.raises(ValueError, match="truncated.gguf"):
        load_model(str(truncated))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(empty_dir))
    (empty_dir / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'
    )
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(str(empty_dir))


def test_unknown_architecture(tmp_path):
    d = tmp_path / "gpt2ish"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}')
    # one line: the architecture, the closest one served, where the full list is
    one_line = r"GPT2LMHeadModel; the closest radixlm serves: \w+ .*radixlm models"
    with pytest.raises(ValueError, match=one_line):
        load_model(str(d))
