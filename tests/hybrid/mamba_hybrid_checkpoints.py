"""Tiny random-weight checkpoints of the Mamba-2 hybrids: HF GraniteMoeHybridForCausalLM
(Granite-4.0-H) and FalconH1ForCausalLM, with muP-style multipliers, and Zamba2ForCausalLM (shared
attention blocks); float32, saved with the tiny tokenizer of tests/model/hybrid_checkpoints.py,
weights drawn as hf_model draws them there (norms around 1, A_log = log(U(1, 16)), dt_bias so
dt = softplus(dt + dt_bias) stays small, bf16-rounded). Every multiplier is set away from 1 so a
missing one shows in the logits.

And the checks their tests share: the Engine they run in (small pools, 100-token prefill chunks,
invariant checks), HF's greedy reference, a prompt's log-probs against HF's."""

from __future__ import annotations

import random

import torch
import transformers

from radixlm import Engine
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import RESIDUAL_WRITERS

NEW = 10
VOCAB = 800  # the tiny tokenizer's ordinary tokens
ATOL = 1e-4

_MAMBA_TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
CONFIGS = {
    "GraniteMoeHybridForCausalLM": dict(
        _MAMBA_TINY,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "mamba"],
        intermediate_size=32,  # of one expert
        shared_intermediate_size=48,
        num_local_experts=4,
        num_experts_per_tok=2,
        mamba_n_heads=8,
        mamba_d_head=16,  # 8 heads x 16 = mamba_expand (2) x hidden
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        position_embedding_type="nope",  # Granite-4.0-H's attention has no RoPE
        embedding_multiplier=3.0,
        attention_multiplier=0.1,  # the attention scale (not head_dim ** -0.5 = 0.25)
        residual_multiplier=0.5,
        logits_scaling=2.0,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    # Every layer attention and Mamba-2 side by side; the released models' gated norm (after the
    # gate, over 2 groups).
    "FalconH1ForCausalLM": dict(
        _MAMBA_TINY,
        num_hidden_layers=4,
        intermediate_size=96,
        mamba_d_ssm=128,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_rms_norm=True,
        mamba_norm_before_gate=False,
        embedding_multiplier=3.0,
        lm_head_multiplier=0.5,
        key_multiplier=0.7,
        attention_in_multiplier=1.5,
        attention_out_multiplier=0.6,
        ssm_in_multiplier=1.3,
        ssm_out_multiplier=0.8,
        ssm_multipliers=[0.9, 1.2, 0.8, 1.1, 0.7],  # z, x, B, C, dt
        mlp_multipliers=[1.4, 0.6],  # gate, down
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    ),
    # Mamba-2 layers, three of them hybrid (shared blocks 0, 1, 0: block 0 runs twice with its
    # own adapters and KV each time); attention adapters on q / k / v, RoPE, the gelu MLP.
    "Zamba2ForCausalLM": dict(
        hidden_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,  # head_dim 2 * 64 / 4 = 32
        num_key_value_heads=4,  # the k / v adapters need every head (HF's own constraint)
        layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid", "hybrid"],
        intermediate_size=96,
        n_mamba_heads=8,  # head_dim 2 * 64 / 8 = 16
        mamba_ngroups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        num_mem_blocks=2,
        use_shared_attention_adapter=True,
        adapter_rank=8,
        use_mem_rope=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=2048,
        tie_word_embeddings=True,  # HF ties the shared blocks only with it (models/zamba2.py)
    ),
}
_CONFIG_CLASSES = {
    "GraniteMoeHybridForCausalLM": "GraniteMoeHybridConfig",
    "FalconH1ForCausalLM": "FalconH1Config",
    "Zamba2ForCausalLM": "Zamba2Config",
}


def hf_model(arch: str, tokenizer, seed: int = 0, scaled_residual: bool = False, **changes):
    """A random float32 HF model of `arch` sized for `tokenizer`. scaled_residual: the residual
    writers (and Zamba2's `linear`, which writes its shared block's output into the Mamba layer's
    input) times 1 / sqrt(2 layers), GPT-2's init (tests/model/ssm_checkpoints.py): without it
    the tiny Zamba2's own float32 rounding moves a log-prob by 3e-4 from its float64 value, past
    ATOL; with it, by 3e-5."""
    cfg = getattr(transformers, _CONFIG_CLASSES[arch])(
        **{
            **CONFIGS[arch],
            "vocab_size": -(-len(tokenizer) // 8) * 8,  # as llama.cpp's Mamba-2 converters pad it
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **changes,
        }
    )
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    hf = getattr(transformers, arch)(cfg).to(torch.float32)
    randomize(hf)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            if name.endswith("dt_bias"):
                p.copy_(torch.empty(p.shape).uniform_(-3, -1, generator=g))
            if name == "lm_head.weight":  # logits of a real model's spread: top-1 far from ties
                p.mul_(8)
            if scaled_residual and name.endswith((*RESIDUAL_WRITERS, ".linear.weight")):
                p.mul_((2 * cfg.num_hidden_layers) ** -0.5)
            p.copy_(p.bfloat16().float())
    return hf.eval()


def checkpoint(arch: str, path: str, tokenizer, **changes):
    """(path, hf model): the model saved with save_pretrained beside its tokenizer."""
    hf = hf_model(arch, tokenizer, **changes)
    hf.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, hf


def engine(path: str) -> Engine:
    return Engine(
        model_path=path,
        quantization="none",
        enable_invariant_checks=True,
        chunked_prefill_size=100,
        max_total_tokens=4096,
        max_mamba_cache_size=24,
        log_level="warning",
    )


def reference(hf):
    """ref(ids) -> (ids, HF's greedy tokens, HF's logits along them), as assert_greedy_equal
    takes them (cached)."""
    cache: dict[tuple, tuple] = {}

    def ref(ids: list[int], n: int = NEW) -> tuple:
        if (tuple(ids), n) not in cache:
            with torch.no_grad():
                out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
                gen = out[0, len(ids) :].tolist()
                logits = hf(torch.tensor([ids + gen])).logits[0, len(ids) - 1 :]
            cache[tuple(ids), n] = (ids, gen, logits)
        return cache[tuple(ids), n]

    return ref


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB) for _ in range(n)]


def assert_prompt_logprobs(eng: Engine, hf, ids: list[int], label: str) -> None:
    """Each prompt token's log-prob (prefilled in chunks through the KV and state pools) equals
    HF's."""
    out = eng.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
    )
    got = torch.tensor([row[0] for row in out["meta_info"]["input_token_logprobs"][1:]])
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1].float(), -1)
    want = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    diff = (got - want).abs().max().item()
    assert diff < ATOL, f"{label}: max |log-prob diff| {diff:.2e}"


def check_greedy_alone_batched_and_chunked(eng: Engine, ref, label: str) -> None:
    """HF's greedy tokens (near-tie rule) for prompts alone (nothing cached; 150 and 300 tokens
    prefilled in 100-token chunks), then all of them batched."""
    rng = random.Random(1)
    prompts = [tokens(rng, 7), tokens(rng, 150), tokens(rng, 300), [9] * 5]
    sp = {"max_new_tokens": NEW, "temperature": 0}
    for i, p in enumerate(prompts):
        assert eng.flush_cache()
        out = eng.generate(input_ids=p, sampling_params=sp)
        assert_greedy_equal(out["output_ids"], ref(p), f"{label} alone #{i}")
        assert out["meta_info"]["cached_tokens"] == 0
    assert eng.flush_cache()
    for i, out in enumerate(eng.generate(input_ids=prompts, sampling_params=sp)):
        assert_greedy_equal(out["output_ids"], ref(prompts[i]), f"{label} batched #{i}")


def check_second_turn_reuses_the_cached_prefix(eng: Engine, ref, label: str) -> None:
    """A turn 2 (turn 1's prompt, its answer, 5 more tokens) resumes from turn 1's cached KV and
    state snapshot and still answers HF's tokens."""
    rng = random.Random(2)
    sp = {"max_new_tokens": NEW, "temperature": 0}
    assert eng.flush_cache()
    p = tokens(rng, 300)
    out = eng.generate(input_ids=p, sampling_params=sp)
    assert_greedy_equal(out["output_ids"], ref(p), f"{label} turn 1")
    turn2 = p + out["output_ids"] + tokens(rng, 5)
    again = eng.generate(input_ids=turn2, sampling_params=sp)
    assert_greedy_equal(again["output_ids"], ref(turn2), f"{label} turn 2")
    # turn 1's prompt and answer (its last token's KV was never computed)
    assert again["meta_info"]["cached_tokens"] >= len(p) + len(out["output_ids"]) - 1
