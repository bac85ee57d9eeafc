"""Tiny DeepSeek-V3 and GLM-4.5 checkpoints WITH their multi-token-prediction (NextN) layer, as the
released ones ship it: HF safetensors (`model.layers.{num_hidden_layers}.{enorm, hnorm, eh_proj,
shared_head.norm, shared_head.head, embed_tokens}` + the layer's own attention / MoE tensors) beside
the tiny BPE tokenizer, and the same weights as a GGUF in the layout llama.cpp's converter writes
with the head kept (block_count counting it, `nextn_predict_layers`, `blk.N.nextn.*`).

transparent=True zeroes the NextN layer's residual writers (o_proj, the experts' and shared
experts' down_proj): the layer passes its input through, so a fit of eh_proj and the norms
(MtpHead.fit_parameters) is exact gradient descent; and scales the decoder's own by 0.1, so that
each greedy token depends mostly on the one before (as EAGLE's test target, conftest.py's
hot_model_dir): answers a head of one projection can learn in seconds."""

from __future__ import annotations

import torch
import transformers

from tests.model.gguf_moe_writer import add_glm4moe_header, add_stacked_moe_tensors
from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import _add_vocab, tiny_tokenizer
from tests.model.test_gguf_archs import write_and_close

COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_attention_heads=4,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    first_k_dense_replace=1,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    num_nextn_predict_layers=1,
    tie_word_embeddings=False,
)
FAMILIES = {
    "deepseek_v3": lambda vocab, eos: transformers.DeepseekV3Config(
        **COMMON,
        vocab_size=vocab,
        eos_token_id=eos,
        pad_token_id=0,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
    ),
    "glm4_moe": lambda vocab, eos: transformers.Glm4MoeConfig(
        **COMMON,
        vocab_size=vocab,
        eos_token_id=eos,
        pad_token_id=0,
        num_key_value_heads=2,
        head_dim=16,
        partial_rotary_factor=0.5,
        attention_bias=True,
        use_qk_norm=True,
    ),
}
LAYERS = 2  # the decoder's; the NextN layer is model.layers.2
RESIDUAL_WRITERS = ("self_attn.o_proj.weight", "down_proj", "down_proj.weight")


def checkpoint(path: str, family: str, transparent: bool = False, seed: int = 0, nextn: int = 1):
    """The HF model (without its NextN layers: transformers does not run them) and the NextN
    layers' tensors under the checkpoint's names; both saved at path with the tokenizer. nextn:
    how many (num_nextn_predict_layers; DeepSeek-V3's / GLM's chained heads when > 1)."""
    from safetensors.torch import save_file

    tok = tiny_tokenizer()
    cfg = FAMILIES[family](len(tok), tok.eos_token_id)
    cfg.num_nextn_predict_layers = nextn
    cfg.num_hidden_layers = LAYERS + nextn  # built with the NextN layers' decoder part, split off
    torch.manual_seed(seed)
    full = (
        transformers.DeepseekV3ForCausalLM(cfg)
        if family == "deepseek_v3"
        else transformers.Glm4MoeForCausalLM(cfg)
    ).float()
    randomize(full)
    with torch.no_grad():
        full.lm_head.weight.mul_(8)  # a real model's logit spread: greedy choices far from ties
        if transparent:
            for name, p in full.named_parameters():
                if name.endswith(RESIDUAL_WRITERS) and _layer(name) < LAYERS:
                    p.mul_(0.1)
    state = full.state_dict()
    cfg.num_hidden_layers = LAYERS
    cfg.architectures = [type(full).__name__]
    hf = type(full)(cfg).float().eval()
    hf.load_state_dict({k: v for k, v in state.items() if _layer(k) < LAYERS})
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    mtp = {}
    for i in range(nextn):
        mtp.update(mtp_tensors(state, cfg, transparent, seed + 31 * i, LAYERS + i))
    save_file(mtp, f"{path}/mtp.safetensors", metadata={"format": "pt"})
    return hf, mtp


def _layer(name: str) -> int:
    """The decoder layer a tensor belongs to (-1: none)."""
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


def mtp_tensors(
    state: dict, cfg, transparent: bool, seed: int, n: int = LAYERS
) -> dict[str, torch.Tensor]:
    h = cfg.hidden_size
    p = f"model.layers.{n}."
    g = torch.Generator().manual_seed(seed + 7)
    out = {k: v.clone().contiguous() for k, v in state.items() if k.startswith(p)}
    if transparent:
        for k in out:
            if k.endswith(RESIDUAL_WRITERS):
                out[k].zero_()
    out[p + "eh_proj.weight"] = torch.randn(h, 2 * h, generator=g) * (2 * h) ** -0.5
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        out[p + f"{norm}.weight"] = 1 + 0.2 * torch.randn(h, generator=g)
    out[p + "shared_head.head.weight"] = state["lm_head.weight"].clone()
    out[p + "embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
    return out


def write_gguf(path: str, hf, mtp: dict, tokenizer_dir: str) -> str:
    """hf + its NextN layer as the converter writes them (float32), the layer kept."""
    import gguf

    cfg = hf.config
    if isinstance(hf, transformers.DeepseekV3ForCausalLM):
        from radixlm.model.gguf.archs.deepseek import write_deepseek2_metadata

        w = gguf.GGUFWriter(path, "deepseek2")
        write_deepseek2_metadata(w, cfg, nextn_layers=1)
        arch = gguf.MODEL_ARCH.DEEPSEEK2
    else:
        w = gguf.GGUFWriter(path, "glm4moe")
        add_glm4moe_header(w, cfg, nextn=1)
        arch = gguf.MODEL_ARCH.GLM4_MOE
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers + 1)
    add_stacked_moe_tensors(w, {**hf.state_dict(), **mtp}, lambda name: _name(names, name))
    write_and_close(w)
    return path


# The converter's names for the NextN tensors (gguf-py's NEXTN_* entries).
NEXTN = {
    "eh_proj": "eh_proj",
    "enorm": "enorm",
    "hnorm": "hnorm",
    "shared_head.norm": "shared_head_norm",
    "shared_head.head": "shared_head_head",
    "embed_tokens": "embed_tokens",
}


def _name(names, hf_name: str) -> str:
    layer, _, rest = hf_name.removeprefix("model.layers.").partition(".")
    module, _, kind = rest.rpartition(".")
    if hf_name.startswith("model.layers.") and module in NEXTN:
        return f"blk.{layer}.nextn.{NEXTN[module]}.{kind}"
    gname = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    assert gname is not None, hf_name
    return gname
