"""Pipeline parallelism through the one decoder stack (model/decoder_stack.py) for the families
that used to refuse it: at --pp-size 2 a windowed Gemma 2, a post-norm OLMo 3 (whose layers carry
no residual: the stages hand over the stream alone), gpt-oss (sinks, windows and experts), a
Qwen3-MoE, DeepSeek-V2 (MLA's latent pool per stage), GLM-4.5 and every hybrid (Qwen3.5 dense and
MoE, Qwen3-Next, Nemotron-H with and without its MoE blocks, LFM2, Granite-4.0-H, Falcon-H1, Kimi
Linear, Zamba2: each stage's KV pool holds its attention layers and its state pool its recurrent
layers, the same slots on every stage) and Gemma 4 dense and MoE (each stage computes the
per-layer inputs from the ids; the KV-sharing layers stay on the stage of the layers whose KV they
read) and Gemma 3n (the same, its AltUp copies handed over flattened) give HF's greedy tokens
(near-tie rule) alone, batched and in prefill chunks smaller than the prompt. A partition that would
split Gemma 4's KV-sharing layers is refused, naming pp_size."""

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


def _gemma4(layout):
    def make(path):
        from tests.model import gemma4_checkpoint as g4

        return g4.gemma4_checkpoint(path, **getattr(g4, layout))

    return make


def _gemma3n(path):
    from tests.model.gemma3n_checkpoint import gemma3n_checkpoint

    return gemma3n_checkpoint(path, tie_word_embeddings=False)


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
    # every stage running a shared block embeds the tokens itself (the block's input)
    "zamba2": _mamba_hybrid("Zamba2ForCausalLM"),
    "kimi-linear": _kimi,
    "gemma4": _gemma4("DENSE"),
    "gemma4-moe": _gemma4("MOE"),
    "gemma3n": _gemma3n,
}


@pytest.mark.parametrize("family", FAMILIES)
def test_pp2_gives_hf_greedy(family, tmp_path):
    path = str(tmp_path / family)
    hf = FAMILIES[family](path)
    check_greedy(path, hf, f"{family} pp=2", pp_size=2)


def test_gemma4_split_keeps_kv_sharing_layers_together():
    """The last stage holds the KV-sharing layers and the layers whose KV they read; the stages
    before it split the rest evenly (an even split where it already keeps them together)."""
    from types import SimpleNamespace

    from radixlm.distributed.pp_partition import layer_counts
    from radixlm.model.models.gemma4 import kv_source_layers

    assert layer_counts(6, 2, last_from=2) == (2, 4)  # the tiny checkpoint: 4 and 5 read 2 and 3
    assert layer_counts(6, 2, last_from=3) == (3, 3)
    assert layer_counts(6, 3, last_from=2) == (1, 1, 4)
    assert layer_counts(6, 2, (1, 5), last_from=2) == (1, 5)
    # E2B's shape: 35 layers, every fifth global, the last 20 reading layers 13 and 14's KV
    e2b = SimpleNamespace(
        num_hidden_layers=35,
        num_kv_shared_layers=20,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
    )
    source = kv_source_layers(e2b)
    last_from = min(s for i, s in enumerate(source) if s != i)
    assert (last_from, set(source[15:])) == (13, {13, 14})
    assert layer_counts(35, 2, last_from=last_from) == (13, 22)
    assert layer_counts(35, 4, last_from=last_from) == (4, 5, 4, 22)
    with pytest.raises(ValueError, match=r"pp_layer_partition 3,3 \(pp_size 2\) splits"):
        layer_counts(6, 2, (3, 3), last_from=2)
    with pytest.raises(ValueError, match="pp_size 4 is too large for this model: layers 2-5"):
        layer_counts(6, 4, last_from=2)


def test_gemma4_partition_splitting_kv_sharing_is_refused(tmp_path):
    from radixlm import Engine
    from tests.conftest import engine_args
    from tests.model.gemma4_checkpoint import DENSE, gemma4_checkpoint

    path = str(tmp_path / "gemma4")
    gemma4_checkpoint(path, **DENSE)
    with pytest.raises(ValueError, match=r"pp_layer_partition 3,3 \(pp_size 2\) splits the"):
        Engine(path, **engine_args(quantization="none", pp_size=2, pp_layer_partition="3,3"))
