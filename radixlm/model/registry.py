"""Model registry: HF `architectures` name -> our model class."""

from __future__ import annotations

from torch import nn

from radixlm.model.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from radixlm.model.models.gemma2 import Gemma2ForCausalLM
from radixlm.model.models.gemma3 import Gemma3ForCausalLM
from radixlm.model.models.idefics3 import Idefics3ForConditionalGeneration
from radixlm.model.models.llama import LlamaForCausalLM, MistralForCausalLM
from radixlm.model.models.llava import LlavaForConditionalGeneration
from radixlm.model.models.moe_families import (
    MixtralForCausalLM,
    OlmoeForCausalLM,
    Qwen2MoeForCausalLM,
    Qwen3MoeForCausalLM,
)
from radixlm.model.models.phi3 import Phi3ForCausalLM
from radixlm.model.models.qwen2 import Qwen2ForCausalLM
from radixlm.model.models.qwen2_vl import (
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
)
from radixlm.model.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    # Mixtures of experts (models/moe_families.py).
    "MixtralForCausalLM": MixtralForCausalLM,
    "OlmoeForCausalLM": OlmoeForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    # Vision-language (images in; docs/vision.md).
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    "Idefics3ForConditionalGeneration": Idefics3ForConditionalGeneration,
    "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,
    # Base-model checkpoints (no lm_head): embedding models, served with --is-embedding.
    "LlamaModel": LlamaForCausalLM,
    "Qwen2Model": Qwen2ForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def resolve_architecture(architectures: list[str] | None) -> tuple[str, type[nn.Module]]:
    """The first of a config's `architectures` that radixlm implements."""
    for arch in architectures or []:
        if arch in MODEL_REGISTRY:
            return arch, MODEL_REGISTRY[arch]
    raise ValueError(
        f"unsupported model architecture {architectures}; radixlm supports:"
        f" {', '.join(supported_architectures())}"
    )


def get_model_class(architecture: str) -> type[nn.Module]:
    return resolve_architecture([architecture])[1]
