"""Tensor parallelism at the model level: every architecture's TP=2 and TP=3 shards (real gloo
ranks, one thread each, each rank reading only its slices of the checkpoint) give the TP=1 model's
greedy tokens and, within float32 summation-order noise, its logits; HF safetensors and GGUF files
(q/k row permutation, Gemma's norm offset, Phi-3's fused tensors) alike.

KV heads: split where tp_size divides them (6 heads), replicated where they are fewer than the ranks
(1 head). The TP=1 reference is the same loader without a tp group: tests/model checks it against
HF.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm.model.loader import load_model
from tests.distributed.ranks import run_ranks
from tests.model.helpers import PoolHarness, randomize
from tests.model.test_gemma import _write_gguf as write_gemma_gguf
from tests.model.test_gguf_archs import _write_gguf as write_llama_gguf
from tests.model.test_phi3 import write_phi3_gguf

BASE = dict(
    vocab_size=384,
    hidden_size=96,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=6,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
GEMMA = dict(
    BASE,
    head_dim=32,
    sliding_window=8,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    query_pre_attn_scalar=32,
)
CASES = {
    # name: (HF config class, config, architecture, GGUF writer arch or None)
    "llama": (
        "LlamaConfig",
        dict(BASE, num_key_value_heads=6, tie_word_embeddings=False),
        "LlamaForCausalLM",
        "llama",
    ),
    "qwen2": (
        "Qwen2Config",
        dict(BASE, num_key_value_heads=1, tie_word_embeddings=True),
        "Qwen2ForCausalLM",
        "qwen2",
    ),
    "qwen3": (
        "Qwen3Config",
        dict(BASE, num_key_value_heads=6, head_dim=32, tie_word_embeddings=False),
        "Qwen3ForCausalLM",
        None,
    ),
    "mistral": (
        "MistralConfig",
        dict(BASE, num_key_value_heads=1, sliding_window=8, tie_word_embeddings=False),
        "MistralForCausalLM",
        None,
    ),
    "gemma2": (
        "Gemma2Config",
        dict(
            GEMMA,
            num_key_value_heads=6,
            num_hidden_layers=3,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=4.0,
        ),
        "Gemma2ForCausalLM",
        "gemma2",
    ),
    "gemma3": (
        "Gemma3TextConfig",
        dict(GEMMA, num_key_value_heads=1, num_hidden_layers=6),
        "Gemma3ForCausalLM",
        None,
    ),
    "phi3": (
        "Phi3Config",
        dict(BASE, num_key_value_heads=6, tie_word_embeddings=False, sliding_window=None),
        "Phi3ForCausalLM",
        "phi3",
    ),
}
PROMPTS = [
    [5, 17, 200, 33, 9, 120, 77],
    [40, 41, 300, 8],
    [250, 3, 3, 90, 11, 64, 19, 350, 100, 7, 12],
]
NEW_TOKENS = 12
LOGITS_ATOL = 1e-4  # float32 logits of O(1): a different summation order moves them by ~1e-6


def _write(name: str, kind: str, tmp) -> str:
    cfg_cls, kw, arch, gguf_arch = CASES[name]
    config = getattr(transformers, cfg_cls)(**kw)
    config.architectures = [arch]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    randomize(hf)
    if kind == "safetensors":
        hf.save_pretrained(tmp)
        return str(tmp)
    path = str(tmp / f"{name}.gguf")
    if gguf_arch == "phi3":
        write_phi3_gguf(path, hf, config)
    elif gguf_arch in ("gemma2", "gemma3"):
        write_gemma_gguf(path, gguf_arch, hf, config)
    else:
        write_llama_gguf(path, gguf_arch, hf, config)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    out = {}
    for name, case in CASES.items():
        for kind in ("safetensors", "gguf") if case[3] else ("safetensors",):
            out[f"{name}-{kind}"] = _write(name, kind, tmp_path_factory.mktemp(f"{name}-{kind}"))
    return out


def greedy(path: str, quantization: str = "none") -> tuple[list[list[int]], torch.Tensor]:
    """Batched prefill of PROMPTS, then NEW_TOKENS - 1 batched decode steps: (tokens, prefill
    logits)."""
    loaded = load_model(path, quantization=quantization)
    h = PoolHarness(loaded.model, loaded.hf_config, attn_backend=None)
    reqs = [h.new_request() for _ in PROMPTS]
    first = torch.stack([lg[-1] for lg in h.extend(reqs, PROMPTS)])
    tokens = [[t] for t in first.argmax(-1).tolist()]
    for _ in range(NEW_TOKENS - 1):
        nxt = h.decode(reqs, [t[-1] for t in tokens]).argmax(-1).tolist()
        for t, n in zip(tokens, nxt, strict=True):
            t.append(n)
    return tokens, first


def _greedy_all(rank: int, paths: dict[str, str]) -> dict:
    # numpy, not tensors: a tensor crosses processes through shared memory that dies with the rank
    return {
        name: (tokens, logits.numpy())
        for name, (tokens, logits) in ((name, greedy(path)) for name, path in paths.items())
    }


@pytest.fixture(scope="module")
def reference(checkpoints) -> dict:
    torch.set_num_threads(1)
    return {name: greedy(path) for name, path in checkpoints.items()}


@pytest.mark.parametrize("tp", [2, 3])
def test_tp_greedy_and_logits_match_tp1(tp, checkpoints, reference):
    ranks = run_ranks(_greedy_all, tp, checkpoints)
    for name, (ref_tokens, ref_logits) in reference.items():
        for rank, results in enumerate(ranks):
            tokens, logits = results[name][0], torch.from_numpy(results[name][1])
            assert tokens == ref_tokens, f"{name} tp={tp} rank {rank}: {tokens} != {ref_tokens}"
            diff = (logits - ref_logits).abs().max().item()
            assert diff < LOGITS_ATOL, f"{name} tp={tp} rank {rank}: logits differ by {diff}"
        # every rank holds the same (all-gathered) logits, bit for bit
        assert all((r[name][1] == ranks[0][name][1]).all() for r in ranks[1:]), name


def _prefill_logits(rank: int, path: str, quantization: str):
    return greedy(path, quantization)[1].numpy()


def test_quantized_default_model_tp3_within_its_noise_floor(default_model_path, monkeypatch):
    """The default GGUF (Q4_1, 9 heads / 3 KV heads) at TP=3 in its own quantization. The
    row-parallel sums change the float summation order (last-bit changes), and the int8 activation
    grid of the next layers turns some of them into different roundings, so the logits drift from
    TP=1's. The tolerance is that noise floor, measured here in one process: TP=3's drift is at most
    twice the drift that 1e-7 relative noise on the row-parallel outputs causes at TP=1, and below
    what the quantization itself moves the logits (Q4_1 vs float32); the argmax stays."""
    from radixlm.model.layers.parallel_linear import RowParallelLinear

    torch.set_num_threads(1)
    _, q1 = greedy(default_model_path, "gguf")
    _, f1 = greedy(default_model_path, "none")
    q3 = torch.from_numpy(run_ranks(_prefill_logits, 3, default_model_path, "gguf")[0])
    plain = RowParallelLinear.forward
    g = torch.Generator().manual_seed(0)
    monkeypatch.setattr(
        RowParallelLinear,
        "forward",
        lambda self, x: (
            plain(self, x) * (1 + 1e-7 * torch.randn(x.shape[0], self.out_features, generator=g))
        ),
    )
    _, noisy = greedy(default_model_path, "gguf")
    drift, floor, quant = (
        (q3 - q1).abs().max().item(),
        (noisy - q1).abs().max().item(),
        (q1 - f1).abs().max().item(),
    )
    assert 0 < floor and drift <= 2 * floor, f"TP=3 drift {drift}, last-bit noise floor {floor}"
    assert drift < quant, f"TP=3 drift {drift} >= the quantization's own {quant}"
    assert torch.equal(q3.argmax(-1), q1.argmax(-1))
