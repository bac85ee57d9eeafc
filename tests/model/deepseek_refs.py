"""Tiny random DeepSeek-V2 / V3 / V3.2 models for the MLA tests, and a pool harness with the
latent pool and the MLA backend (the layout ModelRunner picks for them)."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm.model.layers.attention.mla_backend import MLABackend
from radixlm.model.memory.kv_layout import kv_layout
from tests.model.helpers import PoolHarness

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=3,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    v_head_dim=16,
    qk_nope_head_dim=16,
    first_k_dense_replace=1,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 128,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
    "beta_fast": 32,
    "beta_slow": 1,
}

CONFIGS = {
    # V2-Lite's shape: no q LoRA, softmax routing over groups, routed_scaling_factor, YaRN + mscale
    "v2": lambda: transformers.DeepseekV2Config(
        **COMMON,
        q_lora_rank=None,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=1.5,
        rope_parameters=YARN,
    ),
    # V3's: q LoRA, sigmoid + e_score_correction_bias, grouped top-k, normalized weights, scaling
    # 2.5
    "v3": lambda: transformers.DeepseekV3Config(
        **COMMON,
        q_lora_rank=24,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    ),
}


# V3.2 (DeepSeek Sparse Attention): V3's model with an indexer whose top-k (12) is well below the
# tests' prompts, so the selection prunes; 8 indexer heads make exact ties of the relu'd scores
# (every head negative) rare.
def _v32(**kw):
    return transformers.DeepseekV32Config(
        **COMMON,
        q_lora_rank=24,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        index_topk=12,
        index_head_dim=16,
        index_n_heads=8,
        **kw,
    )


# v32-yarn: V3.2's released RoPE, whose tables the indexer's rotate-half RoPE reads too.
SPARSE_CONFIGS = {"v32": _v32, "v32-yarn": lambda: _v32(rope_parameters=YARN)}
ARCHITECTURES = {
    "v2": "DeepseekV2ForCausalLM",
    "v3": "DeepseekV3ForCausalLM",
    "v32": "DeepseekV32ForCausalLM",
    "v32-yarn": "DeepseekV32ForCausalLM",
}


def make_hf(name: str):
    cfg = {**CONFIGS, **SPARSE_CONFIGS}[name]()
    cfg.architectures = [ARCHITECTURES[name]]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    g = torch.Generator().manual_seed(1)
    with (
        torch.no_grad()
    ):  # everything drawn (norms off 1, a real correction bias) so a mis-load shows
        for pname, p in hf.named_parameters():
            if "norm" in pname:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in pname:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        for mod in hf.modules():
            if hasattr(mod, "e_score_correction_bias"):
                mod.e_score_correction_bias.copy_(
                    0.3 * torch.randn(mod.e_score_correction_bias.shape, generator=g)
                )
    return hf, cfg


class MLAHarness(PoolHarness):
    """PoolHarness over the latent pool (kv_layout) and an MLA backend."""

    def __init__(
        self,
        model,
        config,
        absorb: bool = True,
        native: bool = True,
        kv_size: int = 4096,
        kv_dtype: torch.dtype = torch.float32,
        **kw,
    ):
        super().__init__(
            model,
            config,
            attn_backend=MLABackend(absorb=absorb, native=native),
            kv_size=kv_size,
            **kw,
        )
        g = torch.Generator().manual_seed(kw.get("seed", 0))
        self.kv_pool = kv_layout(model, config).create_pool(
            kv_size, config.num_hidden_layers, kv_dtype
        )
        self.kv_pool.free_slots = self.kv_pool.free_slots[torch.randperm(kv_size, generator=g)]


def save_hf(name: str, path, tokenizer_path: str):
    """make_hf(name) written to `path` as a checkpoint a server loads, with the default model's
    tokenizer (the storage tier keys KV by a tokenizer); its generation config made
    greedy-comparable.
    """
    from radixlm.model.loader import load_tokenizer

    hf, cfg = make_hf(name)
    hf.save_pretrained(path)
    load_tokenizer(tokenizer_path).save_pretrained(path)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return str(path), hf, cfg


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The references' tiny matmuls: one thread (torch's team only waits on a busy machine); a
    module that imports this fixture runs with it."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# The Engine-vs-HF comparison the MLA families' tests share (DeepSeek-V3.2, LongCat-Flash).
ENGINE_ATOL = 1e-4  # test_deepseek.py's
ENGINE_NEW = 24


def random_prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


def hf_reference(hf, ids: list[int], new: int = ENGINE_NEW) -> tuple[list[int], torch.Tensor]:
    """HF's greedy tokens and the log-probabilities of every position of ids + them."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        gen = out[0, len(ids) :].tolist()
        logp = torch.log_softmax(hf(out).logits[0].float(), -1)
    return gen, logp


def assert_matches_hf(out: dict, ids: list[int], ref: tuple, label: str) -> None:
    gen, logp = ref
    assert out["output_ids"] == gen, label
    lps = out["meta_info"]["output_token_logprobs"]
    assert len(lps) == len(gen), label
    got = torch.tensor([lp for lp, _, _ in lps])
    want = torch.tensor([logp[len(ids) - 1 + k, t].item() for k, t in enumerate(gen)])
    assert (got - want).abs().max().item() < ENGINE_ATOL, label
