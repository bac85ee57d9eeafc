"""Which served models are rerankers (/v1/rerank; engine/rerank.py), read off the model's HF
config after --json-model-override-args (SGLang's flag; vLLM's --hf-overrides takes the same
object) is merged into it:

- a cross-encoder: `BertForSequenceClassification` / `XLMRobertaForSequenceClassification`
  (model/models/bert.py), served with --is-embedding as SGLang serves them; its score is the
  classifier's logit.
- a causal yes/no scorer (Qwen3-Reranker): a causal LM whose config names two label tokens in
  vLLM's `classifier_from_token` (["no", "yes"]); its score is the second's probability in the
  softmax over the two tokens' logits after the templated pair. The original Qwen3-Reranker
  checkpoints are plain Qwen3ForCausalLM, so the user declares them as vLLM's docs do:
  {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
  "is_original_qwen3_reranker": true}; `is_original_qwen3_reranker` says the weights are still
  the causal LM's (lm_head included), so the model is built as the causal LM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CROSS_ENCODERS = frozenset({"BertForSequenceClassification", "XLMRobertaForSequenceClassification"})
CROSS_ENCODER = "cross_encoder"
YES_NO = "yes_no"


def parse_overrides(text: str | None) -> dict[str, Any]:
    """--json-model-override-args: a JSON object (ValueError otherwise)."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"json_model_override_args is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"json_model_override_args must be a JSON object, got {type(value).__name__}"
        )
    return value


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> None:
    """Merge the overrides into the HF config (as SGLang and vLLM do), then build an original
    Qwen3-Reranker (declared `...ForSequenceClassification`) as the causal LM it is."""
    for key, value in overrides.items():
        setattr(config, key, value)
    if getattr(config, "is_original_qwen3_reranker", False):
        config.architectures = [
            a.replace("ForSequenceClassification", "ForCausalLM")
            for a in getattr(config, "architectures", None) or []
        ]


@dataclass(frozen=True)
class RerankerSpec:
    kind: str  # CROSS_ENCODER or YES_NO
    label_tokens: tuple[str, ...] = ()  # YES_NO: (the "false" token, the "true" token)

    def info(self) -> dict:
        return {"kind": self.kind, "label_tokens": list(self.label_tokens)}


def reranker_spec(config: Any, architecture: str) -> RerankerSpec | None:
    """The model's reranker kind (module docstring); None: not a reranker."""
    if architecture in CROSS_ENCODERS:
        if int(getattr(config, "num_labels", 1)) != 1:
            raise ValueError(
                f"{architecture} with num_labels {config.num_labels}: a cross-encoder reranker"
                " scores with one label"
            )
        return RerankerSpec(CROSS_ENCODER)
    tokens = getattr(config, "classifier_from_token", None)
    if tokens is None:
        return None
    if (
        not isinstance(tokens, list | tuple)
        or len(tokens) != 2
        or not all(isinstance(t, str) and t for t in tokens)
    ):
        raise ValueError(
            f"classifier_from_token {tokens!r}: a reranker scores with two label tokens, the"
            ' "false" one then the "true" one (e.g. ["no", "yes"])'
        )
    if not architecture.endswith("ForCausalLM"):
        raise ValueError(
            f"classifier_from_token: a yes/no reranker is a causal LM, not {architecture}"
            " (an original Qwen3-Reranker also needs is_original_qwen3_reranker: true)"
        )
    return RerankerSpec(YES_NO, tuple(tokens))
