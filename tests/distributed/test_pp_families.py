"""Pipeline parallelism through the one decoder stack (model/decoder_stack.py) for the families
that used to refuse it: at --pp-size 2 a windowed Gemma 2, a post-norm OLMo 3 (whose layers carry
no residual: the stages hand over the stream alone), gpt-oss (sinks, windows and experts), a
Qwen3-MoE, DeepSeek-V2 (MLA's latent pool per stage), GLM-4.5 and every hybrid (Qwen3.5 dense and
MoE, Qwen3-Next, Nemotron-H with and without its MoE blocks, LFM2, Granite-4.0-H, Falcon-H1, Kimi
Linear: each stage's KV pool holds its attention layers and its state pool its recurrent layers,
the same slots on every stage) give HF's greedy tokens (near-tie rule) alone, batched and in
prefill chunks smaller than the prompt. Gemma 4 still refuses it, saying why in one line."""

from __future__ import annotations

import pytest

from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.model.windowed_checkpoints import WINDOW, check_greedy, checkpoint


def _gemma2(path):
    return checkpoint(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        path,
        sliding_window=WINDOW,
        head_dim=16,
        query_pre_attn_scalar=16,
        hidden_activation="gelu_pytorch_tanh",
        attn_logit_softcapping=30.0,
        final_logit_softcapping=20.0,
    )


def _olmo3(path):
    return checkpoint(
        "Olmo3Config",
        "Olmo3ForCausalLM",
        path,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )


def _gpt_oss(path):
    from tests.model.gpt_oss_checkpoint import gpt_oss_checkpoint

    return gpt_oss_checkpoint(path)


def _qwen3_moe(path):
    from tests.model.moe_checkpoints import hf_model

    hf = hf_model("qwen3_moe", vocab_size=len(tiny_tokenizer()))
    hf.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return hf


def _deepseek_v2(path):
    import torch
    import transformers

    from tests.model.deepseek_refs import CONFIGS
    from tests.model.helpers import randomize

    tok = tiny_tokenizer()
    cfg = CONFIGS["v2"]()
    cfg.vocab_size, cfg.eos_token_id = len(tok), tok.eos_token_id
    cfg.architectures = ["DeepseekV2ForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    randomize(hf)
    with torch.no_grad():
        hf.lm_head.weight.mul_(8)  # logits of a real model's spread: choices far from ties
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return hf


def _glm4_moe(path):
    from tests.model.glm4_moe_checkpoints import checkpoint as glm_checkpoint

    return glm_checkpoint(path)


def _hybrid(arch):
    def make(path):
        from tests.model.hybrid_checkpoints import hybrid_checkpoint

        return hybrid_checkpoint(arch, path)[1]

    return make


def _mamba_hybrid(arch):
    def make(path):
        from tests.hybrid import mamba_hybrid_checkpoints as mh

        return mh.checkpoint(arch, path, tiny_tokenizer())[1]

    return make


def _nemotron_h_moe(path):
    from tests.hybrid.test_nemotron_h_moe import checkpoint as moe_checkpoint

    return moe_checkpoint(path, tiny_tokenizer(), n_group=4, topk_group=2)[1]


def _kimi(path):
    from tests.hybrid import kimi_linear_checkpoint as kc

    return kc.checkpoint(path, tiny_tokenizer(), n_group=1, topk_group=1)[1]


FAMILIES = {
    "gemma2": _gemma2,
    "olmo3": _olmo3,
    "gpt-oss": _gpt_oss,
    "qwen3-moe": _qwen3_moe,
    "deepseek-v2": _deepseek_v2,
    "glm4-moe": _glm4_moe,
    "qwen3_5": _hybrid("qwen35"),
    "qwen3_5-moe": _hybrid("qwen35moe"),
    "qwen3-next": _hybrid("qwen3next"),
    "nemotron-h": _hybrid("nemotron_h"),
    "nemotron-h-moe": _nemotron_h_moe,
    "lfm2": _hybrid("lfm2"),
    "granite-4.0-h": _mamba_hybrid("GraniteMoeHybridForCausalLM"),
    "falcon-h1": _mamba_hybrid("FalconH1ForCausalLM"),
    "kimi-linear": _kimi,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_gives_hf_greedy(family, tmp_path):
    path = str(tmp_path / family)
    hf = FAMILIES[family](path)
    check_greedy(path, hf, f"{family} pp=2", pp_size=2)


def test_pp_refusals_name_the_reason(tmp_path):
    from radixlm import Engine
    from tests.conftest import engine_args
    from tests.model.gemma4_checkpoint import DENSE, gemma4_checkpoint

    path = str(tmp_path / "gemma4")
    gemma4_checkpoint(path, **DENSE)
    with pytest.raises(ValueError, match="Gemma 4 runs with pp_size 1: its per-layer inputs"):
        Engine(path, **engine_args(quantization="none", pp_size=2))
