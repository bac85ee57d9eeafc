"""llama.cpp's `granite` and `granitemoe` GGUFs (Granite 3.x / 4.0 dense, Granite 3.x MoE): its
converter's GraniteModel is LlamaModel (q / k rows permuted for GGML's RoPE, undone at load) with
the muP multipliers written as attention.scale, embedding_scale, residual_scale and logit_scale,
each only where the config has one (llama.cpp then: head_dim ** -0.5 for the attention, 1 for the
rest). GraniteMoeModel splits the experts' input_linear into ffn_gate_exps / ffn_up_exps; its
router is ffn_gate_inp (spec.EXPERT_TENSOR_NAMES). A shared expert (GraniteMoeShared) is refused.
"""

from __future__ import annotations

from radixlm.model.gguf.fields import field
from radixlm.model.gguf.spec import GGUFArchitecture, HFModel


def granite_config(reader, arch: str, kw: dict) -> dict:
    """kw (the keys every architecture shares) plus the multipliers (and the experts')."""
    kw = dict(kw)
    kw.pop("head_dim", None)  # the converter drops Granite's head_dim: hidden / heads
    head_dim = kw["hidden_size"] // kw["num_attention_heads"]
    kw.update(
        attention_multiplier=float(field(reader, f"{arch}.attention.scale") or head_dim**-0.5),
        embedding_multiplier=float(field(reader, f"{arch}.embedding_scale") or 1.0),
        residual_multiplier=float(field(reader, f"{arch}.residual_scale") or 1.0),
        logits_scaling=float(field(reader, f"{arch}.logit_scale") or 1.0),
    )
    names = {t.name for t in reader.tensors}
    kw.update(  # the converter writes the biases a checkpoint has
        attention_bias="blk.0.attn_q.bias" in names, mlp_bias="blk.0.ffn_up.bias" in names
    )
    experts = field(reader, f"{arch}.expert_count")
    if experts:
        if field(reader, f"{arch}.expert_shared_feed_forward_length"):
            raise ValueError(
                f"{arch} GGUF: {arch}.expert_shared_feed_forward_length (a shared expert,"
                " GraniteMoeShared) is not supported"
            )
        kw.update(
            num_local_experts=int(experts),
            num_experts_per_tok=int(field(reader, f"{arch}.expert_used_count")),
        )
    return kw


GRANITE = GGUFArchitecture(
    HFModel("GraniteForCausalLM", "GraniteConfig"), config=granite_config, unpermute_qk=True
)
GRANITE_MOE = GGUFArchitecture(
    HFModel("GraniteMoeForCausalLM", "GraniteMoeConfig"), config=granite_config, unpermute_qk=True
)
