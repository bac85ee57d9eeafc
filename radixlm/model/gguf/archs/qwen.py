"""llama.cpp's dense `qwen2` and `qwen3` GGUFs: the keys every architecture shares and llama's
tensor names; their converters keep q / k in HF's rotate-half order (no permutation).

`qwen3vl` / `qwen3vlmoe`: the text model of a Qwen3-VL / Qwen3-VL-MoE checkpoint (the vision tower
goes to the converter's separate mmproj file, not read here): Qwen3's / Qwen3-MoE's tensors and
keys plus `rope.dimension_sections` (the interleaved M-RoPE's t, h, w sections, which llama.cpp
requires) and `n_deepstack_layers` (how many decoder layers take DeepStack features from the
mmproj). Both are checked; neither changes text: with no image every token's three positions are
equal (plain RoPE over the head) and no DeepStack feature is added, so the file is read as
Qwen3ForCausalLM / Qwen3MoeForCausalLM.
"""

from __future__ import annotations

from radixlm.model.gguf.archs.moe import moe_config
from radixlm.model.gguf.fields import field, required
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel

QWEN2 = GGUFArchitecture(HFModel("Qwen2ForCausalLM", "Qwen2Config"))
QWEN3 = GGUFArchitecture(HFModel("Qwen3ForCausalLM", "Qwen3Config"))


def qwen3vl_config(reader, arch: str, kw: dict) -> dict:
    """kw (the shared keys) after checking the M-RoPE sections and the DeepStack layer count; the
    MoE keys for qwen3vlmoe."""
    head_dim = kw.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
    sections = [int(s) for s in required(reader, arch, "rope.dimension_sections")]
    if len(sections) < 3 or sum(sections[:3]) != head_dim // 2 or min(sections) < 0:
        raise ValueError(
            f"{arch}.rope.dimension_sections {sections}: the t, h, w sections must add up to half"
            f" the head ({head_dim // 2})"
        )
    deepstack = int(field(reader, f"{arch}.n_deepstack_layers", 0))
    if not 0 <= deepstack <= int(kw["num_hidden_layers"]):
        raise ValueError(
            f"{arch}.n_deepstack_layers {deepstack}: not within the {kw['num_hidden_layers']}"
            " decoder layers"
        )
    return moe_config(reader, arch, kw) if arch == "qwen3vlmoe" else kw


QWEN3VL = GGUFArchitecture(HFModel("Qwen3ForCausalLM", "Qwen3Config"), config=qwen3vl_config)
QWEN3VLMOE = GGUFArchitecture(
    HFModel("Qwen3MoeForCausalLM", "Qwen3MoeConfig"), config=qwen3vl_config
)
