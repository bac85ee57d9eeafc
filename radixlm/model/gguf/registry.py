"""The GGUF architectures radixlm reads: llama.cpp's `general.architecture` -> the
GGUFArchitecture (spec.py) of its family's module in archs/, imported at the first file that names
it. The names' order is the one the unknown-architecture error lists them in.

llama (SmolLM2, Llama 2/3, Mistral, Mixtral), smollm3, qwen2, qwen3, phi3, olmo2 with a sliding
window (OLMo 3), gemma2 and gemma3 (what llama.cpp fixes by architecture instead of writing it),
the MoE ones (moe.py, deepseek.py, glm4moe.py), the hybrid qwen35, qwen35moe, qwen3next (the
converter's transformations undone, its tiled V-head order kept), nemotron_h, nemotron_h_moe,
lfm2 and lfm2moe (hybrid_ssm.py), granitehybrid and falcon-h1 (mamba2_hybrid.py), gpt-oss,
gemma3n, gemma4, llama4, kimi-linear; glm4, granite and granitemoe, cohere2; ernie4_5-moe
(ernie.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm.registry import Registry

if TYPE_CHECKING:
    from radixlm.model.gguf.spec import GGUFArchitecture

GGUF_ARCHITECTURE_REGISTRY: Registry[GGUFArchitecture, None] = Registry(
    "GGUF architecture", unknown="unsupported GGUF architecture {name!r}; radixlm reads: {choices}"
)
_ARCHS = "radixlm.model.gguf.archs"
for _name, _target in [
    ("llama", "llama:LLAMA"),
    ("qwen2", "qwen:QWEN2"),
    ("qwen3", "qwen:QWEN3"),
    ("smollm3", "llama:SMOLLM3"),
    ("olmo2", "olmo:OLMO2"),
    ("phi3", "phi3:PHI3"),
    ("gemma2", "gemma:GEMMA2"),
    ("gemma3", "gemma:GEMMA3"),
    ("qwen2moe", "moe:QWEN2MOE"),
    ("qwen3moe", "moe:QWEN3MOE"),
    ("olmoe", "moe:OLMOE"),
    ("qwen35", "qwen35:QWEN35"),
    ("qwen35moe", "qwen35:QWEN35MOE"),
    ("qwen3next", "qwen35:QWEN3NEXT"),
    ("nemotron_h", "hybrid_ssm:NEMOTRON_H"),
    ("nemotron_h_moe", "hybrid_ssm:NEMOTRON_H_MOE"),
    ("lfm2", "hybrid_ssm:LFM2"),
    ("lfm2moe", "hybrid_ssm:LFM2MOE"),
    ("granitehybrid", "mamba2_hybrid:GRANITEHYBRID"),
    ("falcon-h1", "mamba2_hybrid:FALCON_H1"),
    ("gpt-oss", "gpt_oss:GPT_OSS"),
    ("gemma3n", "gemma3n:GEMMA3N"),
    ("gemma4", "gemma4:GEMMA4"),
    ("llama4", "llama4:LLAMA4"),
    ("kimi-linear", "kimi_linear:KIMI_LINEAR"),
    ("deepseek2", "deepseek:DEEPSEEK2"),  # V3 when its gating is sigmoid
    ("deepseek32", "deepseek:DEEPSEEK32"),
    ("glm4moe", "glm4moe:GLM4MOE"),
    ("minimax-m2", "minimax_m2:MINIMAX_M2"),
    ("dots1", "dots1:DOTS1"),
    ("hunyuan-moe", "hunyuan_moe:HUNYUAN_MOE"),
    ("glm4", "glm4:GLM4"),
    ("granite", "granite:GRANITE"),
    ("granitemoe", "granite:GRANITE_MOE"),
    ("cohere2", "cohere2:COHERE2"),
    ("exaone4", "llama_variants:EXAONE4"),
    ("seed_oss", "llama_variants:SEED_OSS"),
    ("apertus", "llama_variants:APERTUS"),
    ("arcee", "llama_variants:ARCEE"),
    ("ernie4_5", "llama_variants:ERNIE4_5"),
    ("ernie4_5-moe", "ernie:ERNIE4_5_MOE"),
    ("hunyuan-dense", "llama_variants:HUNYUAN_DENSE"),
]:
    GGUF_ARCHITECTURE_REGISTRY.register(_name, f"{_ARCHS}.{_target}")
# Issue 90: Mistral 3's text model (Mistral3ForConditionalGeneration's language model) and
# Ministral 3 (Ministral3ForCausalLM), which llama.cpp writes under the same name.
GGUF_ARCHITECTURE_REGISTRY.register("mistral3", f"{_ARCHS}.llama_variants:MISTRAL3")
# Issue 90: the pure state-space models (archs/mamba.py).
GGUF_ARCHITECTURE_REGISTRY.register("mamba2", f"{_ARCHS}.mamba:MAMBA2")
GGUF_ARCHITECTURE_REGISTRY.register("mamba", f"{_ARCHS}.mamba:MAMBA")
GGUF_ARCHITECTURE_REGISTRY.register("jamba", f"{_ARCHS}.mamba:JAMBA")
# Issue 90: Qwen3-VL's and Qwen3-VL-MoE's text models (archs/qwen.py; the mmproj file not read).
GGUF_ARCHITECTURE_REGISTRY.register("qwen3vl", f"{_ARCHS}.qwen:QWEN3VL")
GGUF_ARCHITECTURE_REGISTRY.register("qwen3vlmoe", f"{_ARCHS}.qwen:QWEN3VLMOE")
