"""The text path of GLM-4V's checkpoints (Glm4vForConditionalGeneration: GLM-4.1V-Thinking;
Glm46VForConditionalGeneration: GLM-4.6V with the dense glm4v_text decoder;
Glm4vMoeForConditionalGeneration: GLM-4.5V; models/glm4v.py): a tiny random float32 checkpoint of
each gives the HF model's greedy tokens on text alone (all three M-RoPE positions equal), alone,
batched and in prefill chunks smaller than the prompt, and the radix cache stays exact (a second
turn reusing the first, a branch of a long cached prompt); configs radixlm cannot run are refused
by the field's name. Images: tests/vision/test_glm4v_vs_hf.py."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixlm.model.loader import load_model
from tests.model.cache_checks import check_greedy_and_cache
from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.vision.glm4v_checkpoint import ARCHS, GLM_TOKENS, tiny_glm4v_config


def _ids(n: int) -> dict[str, int]:
    """The image tokens: ids the prompts (10 .. VOCAB) never hold."""
    return {t: n - len(GLM_TOKENS) + i for i, t in enumerate(GLM_TOKENS)}


def _checkpoint(kind: str, tmp_path_factory):
    """(path, the HF model) of a tiny random checkpoint written by save_pretrained."""
    tok = tiny_tokenizer()
    n = len(tok)
    cfg = tiny_glm4v_config(kind, n, _ids(n), eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    hf = getattr(transformers, ARCHS[kind][1])(cfg).float().eval()
    randomize(hf)
    with torch.no_grad():  # logits of a real model's spread: choices far from ties
        hf.lm_head.weight.mul_(8)
    path = str(tmp_path_factory.mktemp(kind))
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module", params=list(ARCHS))
def family(request, tmp_path_factory):
    return request.param, *_checkpoint(request.param, tmp_path_factory)


def test_safetensors_greedy_and_cache_match_hf(family):
    """Alone, batched, in chunks; then turn 2 reuses turn 1, a branch at 512 of a cached 700-token
    prompt reuses >= 256 (cache_checks.py)."""
    kind, path, hf = family
    assert load_model(path).architecture == ARCHS[kind][1]
    # a pool of 2048 tokens, as cache_checks.check_cached_prefixes
    check_greedy_and_cache(path, hf, f"{ARCHS[kind][1]}, text", max_total_tokens=2048)


def _build(kind: str, text: dict | None = None, vision: dict | None = None, **top):
    from radixlm.model.models.glm4v import Glm4vForConditionalGeneration

    cfg = tiny_glm4v_config(kind, 64, _ids(64), **(text or {}))
    for key, value in (vision or {}).items():
        setattr(cfg.vision_config, key, value)
    for key, value in top.items():
        setattr(cfg, key, value)
    return Glm4vForConditionalGeneration(cfg)


@pytest.mark.parametrize(
    "kind, change, field",
    [
        ("glm4v", dict(text=dict(hidden_act="gelu")), "hidden_act"),
        ("glm4v", dict(text=dict(head_dim=16)), "head_dim"),
        (
            "glm4v",
            dict(
                text=dict(
                    rope_parameters={
                        "rope_type": "default",
                        "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.5,
                        "mrope_section": [4, 4, 4],  # 12 of the 8 rotary pairs
                    }
                )
            ),
            "mrope_section",
        ),
        (
            "moe",
            dict(
                text=dict(
                    rope_parameters={
                        "rope_type": "default",
                        "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.5,
                        "mrope_section": [4, 2, 2],
                        "mrope_interleaved": True,
                    }
                )
            ),
            "mrope_interleaved",
        ),
        ("moe", dict(text=dict(use_qk_norm=True)), "use_qk_norm"),
        ("glm46v", dict(vision=dict(out_hidden_size=64)), "out_hidden_size"),
        ("glm4v", dict(vision=dict(model_type="qwen2_vl")), "vision_config.model_type"),
    ],
    ids=[
        "hidden_act",
        "head_dim",
        "mrope_section",
        "mrope_interleaved",
        "use_qk_norm",
        "out_hidden_size",
        "vision-model_type",
    ],
)
def test_unsupported_configs_are_refused_by_name(kind, change, field):
    with pytest.raises(ValueError, match=field):
        _build(kind, **change)


def test_text_config_model_type_is_named():
    """A decoder radixlm does not pair with GLM-4V's tower: refused by the text config's name."""
    cfg = tiny_glm4v_config("glm4v", 64, _ids(64))
    cfg.text_config.model_type = "llama"
    from radixlm.model.models.glm4v import Glm4vForConditionalGeneration

    with pytest.raises(ValueError, match="text_config.model_type"):
        Glm4vForConditionalGeneration(cfg)


def test_moe_experts_per_expert_or_stacked_and_mtp_layers_skipped():
    """GLM-4.5V's released files hold each expert apart (mlp.experts.<e>.gate_proj / up_proj /
    down_proj), transformers' save_pretrained stacks them: both load to the same weights; a layer
    past num_hidden_layers (the multi-token-prediction layer GLM-4.5's checkpoints carry) is
    skipped."""
    from radixlm.model.models.glm4v import Glm4vForConditionalGeneration

    cfg = tiny_glm4v_config("moe", 64, _ids(64))
    torch.manual_seed(0)
    hf = transformers.Glm4vMoeForConditionalGeneration(cfg).float().eval()
    randomize(hf)
    stacked = dict(hf.state_dict())
    apart = {}
    for name, t in stacked.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                apart[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = t[e, :inter]
                apart[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = t[e, inter:]
        elif name.endswith(".mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                apart[name.replace("down_proj", f"{e}.down_proj.weight")] = t[e]
        else:
            apart[name] = t
    mtp = f"model.language_model.layers.{cfg.text_config.num_hidden_layers}."
    apart[mtp + "eh_proj.weight"] = torch.zeros(128, 256)
    apart[mtp + "self_attn.q_proj.weight"] = torch.zeros(128, 128)
    models = []
    for weights in (stacked, apart):
        m = Glm4vForConditionalGeneration(cfg)
        m.load_weights(list(weights.items()))
        models.append(dict(m.named_parameters()))
    assert models[0].keys() == models[1].keys()
    for name, p in models[0].items():
        assert torch.equal(p, models[1][name]), name
