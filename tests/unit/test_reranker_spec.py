"""model/reranker.py: --json-model-override-args read and merged into a HF config, and which
configs are rerankers (vLLM's Qwen3-Reranker overrides, cross-encoders) or refused, saying why."""

import pytest
from transformers import BertConfig, Qwen3Config

from radixlm.model.reranker import (
    CROSS_ENCODER,
    YES_NO,
    apply_overrides,
    parse_overrides,
    reranker_spec,
)

VLLM_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}


def test_vllm_overrides_make_an_original_qwen3_reranker_a_causal_yes_no_scorer():
    cfg = Qwen3Config(architectures=["Qwen3ForCausalLM"])
    assert reranker_spec(cfg, "Qwen3ForCausalLM") is None  # as released: a plain causal LM
    apply_overrides(cfg, VLLM_OVERRIDES)
    assert cfg.architectures == ["Qwen3ForCausalLM"]  # its weights are the causal LM's
    spec = reranker_spec(cfg, cfg.architectures[0])
    assert (spec.kind, spec.label_tokens) == (YES_NO, ("no", "yes"))


def test_cross_encoders_are_rerankers_of_one_label():
    assert reranker_spec(BertConfig(num_labels=1), "BertForSequenceClassification").kind == (
        CROSS_ENCODER
    )
    with pytest.raises(ValueError, match="num_labels 2"):
        reranker_spec(BertConfig(num_labels=2), "BertForSequenceClassification")


@pytest.mark.parametrize(
    ("tokens", "arch", "match"),
    [
        (["yes"], "Qwen3ForCausalLM", "two label tokens"),
        ("yes", "Qwen3ForCausalLM", "two label tokens"),
        (["no", "yes"], "Qwen3ForSequenceClassification", "is_original_qwen3_reranker"),
    ],
)
def test_bad_label_declarations_are_refused(tokens, arch, match):
    cfg = Qwen3Config(classifier_from_token=tokens)
    with pytest.raises(ValueError, match=match):
        reranker_spec(cfg, arch)


@pytest.mark.parametrize(("text", "match"), [("{", "not valid JSON"), ("[1]", "JSON object")])
def test_overrides_must_be_a_json_object(text, match):
    with pytest.raises(ValueError, match=match):
        parse_overrides(text)
    assert parse_overrides('{"a": 1}') == {"a": 1}
