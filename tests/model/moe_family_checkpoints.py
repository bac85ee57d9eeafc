"""Tiny random float32 checkpoints of the MoE families of issue 90 (MiniMax-M2, dots.llm1,
Hunyuan-A13B, ERNIE 4.5 MoE) for tests/model/test_minimax_m2.py, test_dots1.py,
test_hunyuan_moe.py, test_ernie4_5_moe.py:
transformers' model saved beside the tiny BPE tokenizer (windowed_checkpoints.checkpoint), the
router's correction bias drawn so that it changes choices, and the same weights as llama.cpp's
converter writes them (float32 or Q8_0)."""

from __future__ import annotations

import re

import torch
from safetensors.torch import load_file

from tests.model.hybrid_checkpoints import _add_vocab, _stored
from tests.model.test_gguf_archs import write_and_close
from tests.model.windowed_checkpoints import checkpoint

# family -> (config class, architecture, llama.cpp arch, config)
FAMILIES = {
    "minimax_m2": (
        "MiniMaxM2Config",
        "MiniMaxM2ForCausalLM",
        "minimax-m2",
        dict(
            num_hidden_layers=2,
            intermediate_size=32,  # each expert's width
            head_dim=16,
            rotary_dim=8,  # partial RoPE: half of each head rotates
            num_local_experts=8,
            num_experts_per_tok=3,
            max_position_embeddings=1024,
        ),
    ),
    "dots1": (
        "Dots1Config",
        "Dots1ForCausalLM",
        "dots1",
        dict(
            num_hidden_layers=3,
            intermediate_size=96,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=3,
            n_group=2,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            max_position_embeddings=1024,
        ),
    ),
    "hunyuan_moe": (
        "HunYuanMoEV1Config",
        "HunYuanMoEV1ForCausalLM",
        "hunyuan-moe",
        dict(
            num_hidden_layers=2,
            intermediate_size=32,  # the experts' and the shared MLP's width
            head_dim=16,
            num_experts=8,
            moe_topk=3,
            attention_bias=True,
            # the released NTK-alpha RoPE (HF: ntk_alpha)
            rope_parameters={
                "rope_type": "dynamic",
                "alpha": 1000.0,
                "factor": 1.0,
                "rope_theta": 10000.0,
            },
            max_position_embeddings=1024,
        ),
    ),
    # layer 0 dense, 1 and 2 MoE (8 experts, top 3) with one shared expert; the converter's
    # shared width, intermediate_size / num_key_value_heads, is moe_intermediate_size here as in
    # Baidu's models
    "ernie4_5_moe": (
        "Ernie4_5_MoeConfig",
        "Ernie4_5_MoeForCausalLM",
        "ernie4_5-moe",
        dict(
            num_hidden_layers=3,
            intermediate_size=64,
            moe_intermediate_size=32,
            moe_num_experts=8,
            moe_k=3,
            moe_num_shared_experts=1,
            moe_layer_start_index=1,
            max_position_embeddings=1024,
        ),
    ),
}


def _draw_correction_bias(hf) -> None:
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, buf in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.3 * torch.randn(buf.shape, generator=g))


def _draw_ernie_bias(hf) -> None:
    """ERNIE's bias is a parameter (randomize drew it at 0.2, past the softmax scores' ~1/8):
    drawn of the scores' spread, so that it changes some choices without making them all."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def moe_checkpoint(family: str, path: str):
    config_cls, architecture, _, config = FAMILIES[family]
    init = _draw_ernie_bias if family == "ernie4_5_moe" else _draw_correction_bias
    return checkpoint(config_cls, architecture, path, init=init, **config)


def write_moe_gguf(hf, family: str, path: str, out: str, qtype: str = "f32") -> str:
    """The checkpoint at path as convert_hf_to_gguf.py writes it (--outtype f32 or q8_0):
    TextModel's header plus the family's keys (conversion/minimax.py MiniMaxM2Model,
    conversion/dots1.py Dots1Model, conversion/ernie.py Ernie4_5MoeModel), the experts stacked
    per projection, e_score_correction_bias as exp_probs_b.bias, no q/k permutation (NEOX RoPE;
    ERNIE's rows as HF has them)."""
    import gguf

    cfg, arch = hf.config, FAMILIES[family][2]
    model_arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    head_dim = getattr(cfg, "head_dim", None)
    w = gguf.GGUFWriter(out, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(cfg.num_hidden_layers)
    dynamic = cfg.rope_parameters["rope_type"] == "dynamic"
    w.add_context_length(256 * 1024 if dynamic else cfg.max_position_embeddings)  # HunYuan's
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters
    if dynamic:  # HunYuanMoEModel: the NTK-alpha base, no scaling
        dim = cfg.hidden_size // cfg.num_attention_heads
        w.add_rope_freq_base(rope["rope_theta"] * rope["alpha"] ** (dim / (dim - 2)))
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
        w.add_rope_scaling_factor(1)
        w.add_rope_scaling_orig_ctx_len(256 * 1024)
    else:
        w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    if family == "minimax_m2":
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)  # the released scoring_func
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_expert_feed_forward_length(cfg.intermediate_size)
        w.add_rope_dimension_count(cfg.rotary_dim)
    elif family == "ernie4_5_moe":  # Ernie4_5MoeModel.set_gguf_parameters
        w.add_expert_count(cfg.moe_num_experts)
        w.add_interleave_moe_layer_step(cfg.moe_layer_interval)
        w.add_leading_dense_block_count(cfg.moe_layer_start_index)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_count(cfg.moe_num_shared_experts)
        w.add_expert_shared_feed_forward_length(cfg.intermediate_size // cfg.num_key_value_heads)
    elif family == "hunyuan_moe":  # (the converter's own tokenizer and bos override left out)
        w.add_expert_count(cfg.num_experts)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_expert_shared_feed_forward_length(cfg.intermediate_size)
        w.add_expert_feed_forward_length(cfg.intermediate_size)  # moe_intermediate_size[0]
        w.add_expert_shared_count(1)  # num_shared_expert[0]
    else:
        w.add_expert_count(cfg.n_routed_experts)
        w.add_expert_group_count(cfg.n_group)
        w.add_expert_group_used_count(cfg.topk_group)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_leading_dense_block_count(cfg.first_k_dense_replace)
        w.add_expert_shared_count(cfg.n_shared_experts)
        w.add_expert_weights_scale(cfg.routed_scaling_factor)
        w.add_expert_weights_norm(cfg.norm_topk_prob)
    w.add_file_type(ftype)
    _add_vocab(w, path, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    for name, t in _converter_tensors(f"{path}/model.safetensors"):
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        data, dtype = _stored(gname, t.float(), ftype, model_arch)
        w.add_tensor(gname, data, raw_dtype=dtype)
    write_and_close(w)
    return out


_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def _converter_tensors(file: str):
    """The saved tensors as the converter's modify_tensors hands them on: one expert's matrices
    stacked over the experts per projection, e_score_correction_bias renamed."""
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, t in load_file(file).items():
        m = _EXPERT.match(name)
        if m:
            experts.setdefault((m.group(1), m.group(3)), {})[int(m.group(2))] = t
            continue
        yield name.replace("e_score_correction_bias", "e_score_correction.bias"), t
    for (base, proj), per_expert in experts.items():
        yield f"{base}.{proj}.weight", torch.stack([per_expert[e] for e in sorted(per_expert)])


# radixlm's loader names -> HunYuan's (HunYuanMoEV1's modules are named apart from the others')
_HF_NAMES = (
    (".self_attn.q_norm.", ".self_attn.query_layernorm."),
    (".self_attn.k_norm.", ".self_attn.key_layernorm."),
    (".mlp.gate.weight", ".mlp.gate.wg.weight"),
    (".mlp.shared_experts.", ".mlp.shared_mlp."),
)


def hf_holding(hf, gguf_path: str):
    """A copy of hf with the weights of gguf_path as radixlm's GGUF loader reads them (dequantized
    to float32; experts stacked back into HF's gate_up_proj / down_proj, the correction bias
    under HF's name): the reference a quantized file is held to."""
    import copy

    from radixlm.model.gguf.loader import gguf_config, gguf_weights
    from radixlm.model.gguf.reader import open_gguf

    reader = open_gguf(gguf_path)
    weights = dict(gguf_weights(reader, gguf_config(reader)))
    for name in [n for n in weights if n.endswith(".mlp.experts.gate_proj.weight")]:
        base = name.removesuffix("gate_proj.weight")
        gate, up = weights.pop(name), weights.pop(base + "up_proj.weight")
        weights[base + "gate_up_proj"] = torch.cat([gate, up], dim=1)
        weights[base + "down_proj"] = weights.pop(base + "down_proj.weight")
    held = copy.deepcopy(hf)
    state = held.state_dict()
    for name in [n for n in weights if n.endswith("e_score_correction.bias")]:
        bias = weights.pop(name)
        mlp = name.split(".mlp.")[0] + ".mlp."  # the bias's HF name and shape in that layer
        target = next(n for n in state if n.startswith(mlp) and n.endswith("correction_bias"))
        weights[target] = bias.reshape(state[target].shape)
    for name in [n for n in weights if n not in state]:  # HunYuan's own names
        hf_name = name
        for ours, theirs in _HF_NAMES:
            hf_name = hf_name.replace(ours, theirs)
        weights[hf_name] = weights.pop(name)
    if hf.config.tie_word_embeddings:  # ERNIE's: the file has no output.weight
        weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])
    missing = set(state) - set(weights)
    assert not missing, sorted(missing)[:8]
    held.load_state_dict(weights)
    return held.eval()
