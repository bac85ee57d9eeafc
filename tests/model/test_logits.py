"""Our models vs transformers on tiny random models saved as HF safetensors and
loaded through radixlm's loader: prefill, extend over a shared cached prefix,
and ragged batched decode must all give the reference logits (fp32)."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm.model.loader import load_model
from tests.model.helpers import SMALL, PoolHarness, hf_logits, randomize

ATOL = 1e-4
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
CONFIGS = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "llama3-rope-tied": (
        "LlamaConfig",
        dict(tie_word_embeddings=True, rope_scaling=LLAMA3_ROPE, rope_theta=50000.0),
    ),
    "llama-yarn-bias": (
        "LlamaConfig",
        dict(
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            attention_bias=True,
            mlp_bias=True,
        ),
    ),
    "llama-linear-rope": ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "mistral": ("MistralConfig", dict(sliding_window=None, tie_word_embeddings=False)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": (
        "Qwen3Config",
        dict(head_dim=32, tie_word_embeddings=False),
    ),  # head_dim != hidden / heads
}
ARCH = {
    "LlamaConfig": "LlamaForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "Qwen2Config": "Qwen2ForCausalLM",
    "Qwen3Config": "Qwen3ForCausalLM",
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def models(request, tmp_path_factory):
    cfg_cls, extra = CONFIGS[request.param]
    config = getattr(transformers, cfg_cls)(**SMALL, **extra)
    config.architectures = [ARCH[cfg_cls]]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    randomize(hf)
    hf.eval()
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)  # safetensors; a tied lm_head is not written
    loaded = load_model(str(path))
    assert loaded.architecture == ARCH[cfg_cls]
    return request.param, hf, loaded


def _prompts(lengths: list[int], seed: int, vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def _check(name: str, ours: torch.Tensor, ref: torch.Tensor) -> float:
    diff = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    print(f"{name}: max|diff| {diff:.2e} (max|logit| {scale:.2f})")
    assert scale > 1.0, "logits too small for ATOL to mean anything"
    assert diff < ATOL, f"{name}: max abs logit diff {diff:.3e} >= {ATOL}"
    return diff


def test_prefill_batch(models):
    name, hf, loaded = models
    h = PoolHarness(loaded.model, loaded.hf_config)
    prompts = _prompts([5, 11, 17, 1], seed=2)
    reqs = [h.new_request() for _ in prompts]
    outs = h.extend(reqs, prompts)
    for i, (ids, out) in enumerate(zip(prompts, outs)):
        _check(f"{name} prefill[{i}]", out, hf_logits(hf, ids))


def test_extend_over_cached_prefix(models):
    name, hf, loaded = models
    h = PoolHarness(loaded.model, loaded.hf_config, seed=3)
    s1, s2, s3 = _prompts([20, 13, 9], seed=4)
    a1, a2 = h.new_request(), h.new_request()
    h.extend([a1, a2], [s1[:8], s2[:5]])
    # b1 reuses a1's KV slots for s1[:8] (a radix-cache hit); a2 continues its own
    # prefix (chunked prefill); b3 has no prefix. All in one extend batch.
    b1, b3 = h.new_request(share_prefix_of=a1, prefix_len=8), h.new_request()
    o1, o2, o3 = h.extend([b1, a2, b3], [s1[8:], s2[5:], s3])
    _check(f"{name} extend shared prefix", o1, hf_logits(hf, s1)[8:])
    _check(f"{name} extend chunked", o2, hf_logits(hf, s2)[5:])
    _check(f"{name} extend no prefix", o3, hf_logits(hf, s3))


def test_ragged_batched_decode(models):
    name, hf, loaded = models
    h = PoolHarness(loaded.model, loaded.hf_config, seed=5)
    lengths, steps = [3, 10, 6, 15], 5
    seqs = _prompts([n + steps for n in lengths], seed=6)
    refs = [hf_logits(hf, s) for s in seqs]
    reqs = [h.new_request() for _ in seqs]
    h.extend(reqs, [s[:n] for s, n in zip(seqs, lengths)])
    active = list(range(len(seqs)))
    for step in range(steps):
        if step == 3:
            active.remove(1)  # a request finishes: the batch changes shape mid-decode
        pos = [lengths[i] + step for i in active]
        out = h.decode([reqs[i] for i in active], [seqs[i][p] for i, p in zip(active, pos)])
        ref = torch.stack([refs[i][p] for i, p in zip(active, pos)])
        _check(f"{name} decode step {step}", out, ref)
