"""Model registry: HF `architectures` name -> our model class, as a lazy dotted path: a model's
module is imported when a checkpoint names its architecture, not at start-up."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from radixlm.registry import Registry

if TYPE_CHECKING:
    from torch import nn

MODEL_REGISTRY = Registry["type[nn.Module]", None]("model architecture")
MODEL_REGISTRY.register(
    "DeepseekV2ForCausalLM", "radixlm.model.models.deepseek_v2:DeepseekV2ForCausalLM"
)
MODEL_REGISTRY.register(
    "DeepseekV3ForCausalLM", "radixlm.model.models.deepseek_v2:DeepseekV3ForCausalLM"
)
MODEL_REGISTRY.register(
    "DeepseekV32ForCausalLM", "radixlm.model.models.deepseek_v32:DeepseekV32ForCausalLM"
)
MODEL_REGISTRY.register("Gemma2ForCausalLM", "radixlm.model.models.gemma2:Gemma2ForCausalLM")
MODEL_REGISTRY.register("Gemma3ForCausalLM", "radixlm.model.models.gemma3:Gemma3ForCausalLM")
MODEL_REGISTRY.register("Gemma3nForCausalLM", "radixlm.model.models.gemma3n:Gemma3nForCausalLM")
MODEL_REGISTRY.register(  # the text model (the vision and audio towers are not run)
    "Gemma3nForConditionalGeneration", "radixlm.model.models.gemma3n:Gemma3nForCausalLM"
)
MODEL_REGISTRY.register("Gemma4ForCausalLM", "radixlm.model.models.gemma4:Gemma4ForCausalLM")
MODEL_REGISTRY.register(
    "Gemma4ForConditionalGeneration", "radixlm.model.models.gemma4:Gemma4ForCausalLM"
)
MODEL_REGISTRY.register("Glm4MoeForCausalLM", "radixlm.model.models.glm4_moe:Glm4MoeForCausalLM")
MODEL_REGISTRY.register("GptOssForCausalLM", "radixlm.model.models.gpt_oss:GptOssForCausalLM")
MODEL_REGISTRY.register("LlamaForCausalLM", "radixlm.model.models.llama:LlamaForCausalLM")
MODEL_REGISTRY.register("Llama4ForCausalLM", "radixlm.model.models.llama4:Llama4ForCausalLM")
MODEL_REGISTRY.register(  # Scout / Maverick as released: their text model (images not yet)
    "Llama4ForConditionalGeneration", "radixlm.model.models.llama4:Llama4ForCausalLM"
)
MODEL_REGISTRY.register("MistralForCausalLM", "radixlm.model.models.llama:MistralForCausalLM")
MODEL_REGISTRY.register("Olmo2ForCausalLM", "radixlm.model.models.olmo2:Olmo2ForCausalLM")
MODEL_REGISTRY.register("Olmo3ForCausalLM", "radixlm.model.models.olmo3:Olmo3ForCausalLM")
MODEL_REGISTRY.register("Phi3ForCausalLM", "radixlm.model.models.phi3:Phi3ForCausalLM")
MODEL_REGISTRY.register("Qwen2ForCausalLM", "radixlm.model.models.qwen2:Qwen2ForCausalLM")
MODEL_REGISTRY.register("Qwen3ForCausalLM", "radixlm.model.models.qwen3:Qwen3ForCausalLM")
MODEL_REGISTRY.register("SmolLM3ForCausalLM", "radixlm.model.models.smollm3:SmolLM3ForCausalLM")
MODEL_REGISTRY.register("Glm4ForCausalLM", "radixlm.model.models.glm4:Glm4ForCausalLM")
MODEL_REGISTRY.register("GraniteForCausalLM", "radixlm.model.models.granite:GraniteForCausalLM")
MODEL_REGISTRY.register(
    "GraniteMoeForCausalLM", "radixlm.model.models.granite:GraniteMoeForCausalLM"
)
MODEL_REGISTRY.register("Cohere2ForCausalLM", "radixlm.model.models.cohere2:Cohere2ForCausalLM")
# Hybrids: linear-attention layers with a recurrent state beside full attention (docs/hybrid.md).
MODEL_REGISTRY.register("Qwen3_5ForCausalLM", "radixlm.model.models.qwen3_5:Qwen3_5ForCausalLM")
MODEL_REGISTRY.register(  # images in: docs/vision.md
    "Qwen3_5ForConditionalGeneration",
    "radixlm.model.models.qwen3_5_vl:Qwen3_5VLForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "Qwen3_5MoeForCausalLM", "radixlm.model.models.qwen3_next:Qwen3_5MoeForCausalLM"
)
MODEL_REGISTRY.register(
    "Qwen3_5MoeForConditionalGeneration",
    "radixlm.model.models.qwen3_5_vl:Qwen3_5VLForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "Qwen3NextForCausalLM", "radixlm.model.models.qwen3_next:Qwen3NextForCausalLM"
)
MODEL_REGISTRY.register(
    "NemotronHForCausalLM", "radixlm.model.models.nemotron_h:NemotronHForCausalLM"
)
MODEL_REGISTRY.register("Lfm2ForCausalLM", "radixlm.model.models.lfm2:Lfm2ForCausalLM")
MODEL_REGISTRY.register("Lfm2MoeForCausalLM", "radixlm.model.models.lfm2_moe:Lfm2MoeForCausalLM")
MODEL_REGISTRY.register(
    "GraniteMoeHybridForCausalLM",
    "radixlm.model.models.granite_hybrid:GraniteMoeHybridForCausalLM",
)
MODEL_REGISTRY.register("FalconH1ForCausalLM", "radixlm.model.models.falcon_h1:FalconH1ForCausalLM")
MODEL_REGISTRY.register(
    "KimiLinearForCausalLM", "radixlm.model.models.kimi_linear:KimiLinearForCausalLM"
)
# Mixtures of experts (models/moe_families.py).
MODEL_REGISTRY.register(
    "MixtralForCausalLM", "radixlm.model.models.moe_families:MixtralForCausalLM"
)
MODEL_REGISTRY.register("OlmoeForCausalLM", "radixlm.model.models.moe_families:OlmoeForCausalLM")
MODEL_REGISTRY.register(
    "Qwen2MoeForCausalLM", "radixlm.model.models.moe_families:Qwen2MoeForCausalLM"
)
MODEL_REGISTRY.register(
    "Qwen3MoeForCausalLM", "radixlm.model.models.moe_families:Qwen3MoeForCausalLM"
)
# Vision-language (images in; docs/vision.md).
MODEL_REGISTRY.register(
    "LlavaForConditionalGeneration", "radixlm.model.models.llava:LlavaForConditionalGeneration"
)
MODEL_REGISTRY.register(
    "Idefics3ForConditionalGeneration",
    "radixlm.model.models.idefics3:Idefics3ForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "SmolVLMForConditionalGeneration",
    "radixlm.model.models.smolvlm:SmolVLMForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "InternVLForConditionalGeneration",
    "radixlm.model.models.internvl:InternVLForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "Lfm2VlForConditionalGeneration",
    "radixlm.model.models.lfm2_vl:Lfm2VlForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "LlavaOnevisionForConditionalGeneration",
    "radixlm.model.models.llava_onevision:LlavaOnevisionForConditionalGeneration",
)
MODEL_REGISTRY.register(  # a DeepSeek-V3 decoder under MoonViT (transformers' layout)
    "Kimi_K25ForConditionalGeneration",
    "radixlm.model.models.kimi_k25:Kimi_K25ForConditionalGeneration",
)
MODEL_REGISTRY.register(  # the name the released config.json gives (its remote code's class)
    "KimiK25ForConditionalGeneration",
    "radixlm.model.models.kimi_k25:Kimi_K25ForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "Qwen2VLForConditionalGeneration",
    "radixlm.model.models.qwen2_vl:Qwen2VLForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "Qwen2_5_VLForConditionalGeneration",
    "radixlm.model.models.qwen2_vl:Qwen2_5_VLForConditionalGeneration",
)
# Cross-encoders (rerankers, --is-embedding; model/reranker.py).
MODEL_REGISTRY.register(
    "BertForSequenceClassification", "radixlm.model.models.bert:BertForSequenceClassification"
)
MODEL_REGISTRY.register(
    "XLMRobertaForSequenceClassification",
    "radixlm.model.models.bert:XLMRobertaForSequenceClassification",
)
# Base-model checkpoints (no lm_head): embedding models, served with --is-embedding.
MODEL_REGISTRY.register("LlamaModel", "radixlm.model.models.llama:LlamaForCausalLM")
MODEL_REGISTRY.register("Qwen2Model", "radixlm.model.models.qwen2:Qwen2ForCausalLM")
MODEL_REGISTRY.register(
    "MiniMaxM2ForCausalLM", "radixlm.model.models.minimax_m2:MiniMaxM2ForCausalLM"
)
MODEL_REGISTRY.register("Dots1ForCausalLM", "radixlm.model.models.dots1:Dots1ForCausalLM")
MODEL_REGISTRY.register(  # zero-computation experts beside MLA (models/longcat_flash.py)
    "LongcatFlashForCausalLM", "radixlm.model.models.longcat_flash:LongcatFlashForCausalLM"
)
MODEL_REGISTRY.register(
    "HunYuanMoEV1ForCausalLM", "radixlm.model.models.hunyuan_moe:HunYuanMoEV1ForCausalLM"
)
# Issue 90 (i90-text-b): EXAONE 4.0, Seed-OSS, Apertus, Arcee AFM, Ministral 3, ERNIE 4.5,
# Hunyuan dense.
for _arch, _module in [
    ("Exaone4ForCausalLM", "exaone4"),
    ("SeedOssForCausalLM", "seed_oss"),
    ("ApertusForCausalLM", "arcee"),
    ("ArceeForCausalLM", "arcee"),
    ("Ministral3ForCausalLM", "ministral3"),
    ("Ernie4_5ForCausalLM", "ernie4_5"),
    ("Ernie4_5_MoeForCausalLM", "ernie4_5_moe"),
    ("HunYuanDenseV1ForCausalLM", "hunyuan"),
]:
    MODEL_REGISTRY.register(_arch, f"radixlm.model.models.{_module}:{_arch}")


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY.names())


def resolve_architecture(architectures: list[str] | None) -> tuple[str, type[nn.Module]]:
    """The first of a config's `architectures` that radixlm implements; else a one-line
    ValueError naming the first and the closest architecture radixlm serves."""
    for arch in architectures or []:
        if arch in MODEL_REGISTRY:
            return arch, MODEL_REGISTRY.get(arch)
    if not architectures:
        raise ValueError(
            "the model's config.json names no architecture (`architectures`); radixlm reads the"
            " model class from it (supported: docs/models.md#coverage)"
        )
    arch = architectures[0]
    raise ValueError(
        f"unsupported model architecture {arch}; the closest radixlm serves:"
        f" {closest_architecture(arch, supported_architectures())} (full list:"
        " `radixlm models` or docs/models.md#coverage)"
    )


def _family(arch: str) -> str:
    """The family part of an architecture's name: before its head (`ForCausalLM`,
    `ForConditionalGeneration`, `Model`, ...), lower-cased, without underscores."""
    return re.sub(r"(For[A-Z]\w*|LMHeadModel|Model)$", "", arch).replace("_", "").lower()


# Families whose nearest relative radixlm serves is not in their name: state-space models -> a
# Mamba-2 hybrid (Zamba, Zamba2's predecessor: Zamba2).
_RELATIVES = {
    **{
        prefix: "GraniteMoeHybridForCausalLM"
        for prefix in ("mamba", "falconmamba", "bamba", "jamba")
    },
    "zamba": "Zamba2ForCausalLM",
}


def closest_architecture(arch: str, supported: Iterable[str]) -> str:
    """The supported architecture most like `arch`: a relative of its family where names do not
    tell (_RELATIVES), else the longest family prefix it shares (`Glm4vForConditionalGeneration`
    -> `Glm4MoeForCausalLM`), then the most alike whole name (difflib's ratio:
    `Qwen3VLForConditionalGeneration` -> `Qwen3_5ForConditionalGeneration`)."""
    family = _family(arch)
    supported = sorted(supported)
    relative = next((r for p, r in _RELATIVES.items() if family.startswith(p)), None)
    if relative in supported:
        return relative

    def likeness(name: str) -> tuple[int, float]:
        shared = len(os.path.commonprefix([family, _family(name)]))
        return shared, difflib.SequenceMatcher(None, arch, name).ratio()

    return max(supported, key=likeness)


def get_model_class(architecture: str) -> type[nn.Module]:
    return resolve_architecture([architecture])[1]


# Issue 90: the multimodal checkpoints of Gemma 3 and Mistral 3 (docs/vision.md).
MODEL_REGISTRY.register(
    "Gemma3ForConditionalGeneration",
    "radixlm.model.models.gemma3_mm:Gemma3ForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "Mistral3ForConditionalGeneration",
    "radixlm.model.models.mistral3_mm:Mistral3ForConditionalGeneration",
)
# Issue 90: the state-space models (models/mamba.py) and Bamba (models/bamba.py).
MODEL_REGISTRY.register("Mamba2ForCausalLM", "radixlm.model.models.mamba:Mamba2ForCausalLM")
MODEL_REGISTRY.register("MambaForCausalLM", "radixlm.model.models.mamba:MambaForCausalLM")
MODEL_REGISTRY.register(
    "FalconMambaForCausalLM", "radixlm.model.models.mamba:FalconMambaForCausalLM"
)
MODEL_REGISTRY.register("BambaForCausalLM", "radixlm.model.models.bamba:BambaForCausalLM")
MODEL_REGISTRY.register("JambaForCausalLM", "radixlm.model.models.jamba:JambaForCausalLM")
# Mamba-2 layers with shared attention blocks (models/zamba2.py).
MODEL_REGISTRY.register("Zamba2ForCausalLM", "radixlm.model.models.zamba2:Zamba2ForCausalLM")
# Issue 90: Qwen3-VL and Qwen3-VL-MoE (models/qwen3_vl.py: interleaved M-RoPE, DeepStack).
MODEL_REGISTRY.register(
    "Qwen3VLForConditionalGeneration",
    "radixlm.model.models.qwen3_vl:Qwen3VLForConditionalGeneration",
)
MODEL_REGISTRY.register(
    "Qwen3VLMoeForConditionalGeneration",
    "radixlm.model.models.qwen3_vl:Qwen3VLForConditionalGeneration",
)
# GLM-4.1V-Thinking, GLM-4.5V, GLM-4.6V (models/glm4v.py: GLM-4's / GLM-4.5's decoder with M-RoPE).
for _arch in (
    "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration",
    "Glm46VForConditionalGeneration",
):
    MODEL_REGISTRY.register(_arch, "radixlm.model.models.glm4v:Glm4vForConditionalGeneration")
