"""Pipeline parallelism through the one decoder stack (model/decoder_stack.py) for the families
that used to refuse it: at --pp-size 2 a windowed Gemma 2, a post-norm OLMo 3 (whose layers carry
no residual: the stages hand over the stream alone), gpt-oss (sinks, windows and experts) and a
Qwen3-MoE give HF's greedy tokens (near-tie rule) alone, batched and in prefill chunks smaller
than the prompt. The families that still refuse it say why in one line."""

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


FAMILIES = {"gemma2": _gemma2, "olmo3": _olmo3, "gpt-oss": _gpt_oss, "qwen3-moe": _qwen3_moe}


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
