"""llama.cpp's dense `qwen2` and `qwen3` GGUFs: the keys every architecture shares and llama's
tensor names; their converters keep q / k in HF's rotate-half order (no permutation)."""

from __future__ import annotations

from radixlm.model.gguf.spec import GGUFArchitecture, HFModel

QWEN2 = GGUFArchitecture(HFModel("Qwen2ForCausalLM", "Qwen2Config"))
QWEN3 = GGUFArchitecture(HFModel("Qwen3ForCausalLM", "Qwen3Config"))
