"""GLM-4, Granite, GraniteMoe and Cohere2 as llama.cpp's converter (conversion/glm.py,
granite.py, command_r.py) writes them: TextModel's header plus each model class's own keys, its
tensor transforms (LlamaModel.permute of q / k rows and biases for the Granites,
GraniteMoeModel's split of the experts' input_linear, Cohere2Model's zero biases dropped) and its
--outtype: "f32", or "q8_0" (hybrid_checkpoints._stored: matrices in Q8_0, the router, norms and
vectors float32); or "q4_k_m", llama-quantize's Q4_K_M in the types radixlm can write: Q4_K for
the matrices, the ones it gives more bits (attn_v, ffn_down, output) in Q8_0 where llama.cpp
picks Q6_K (which gguf cannot write)."""

from __future__ import annotations

import gguf
import numpy as np

from tests.model.hybrid_checkpoints import _add_vocab, _stored
from tests.model.windowed_checkpoints import _permute

ARCHS = {
    "glm4": gguf.MODEL_ARCH.GLM4,
    "granite": gguf.MODEL_ARCH.GRANITE,
    "granitemoe": gguf.MODEL_ARCH.GRANITE_MOE,
    "cohere2": gguf.MODEL_ARCH.COHERE2,
}
FTYPES = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
}
MORE_BITS = ("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight", "output.weight")


def _header(w, cfg, arch: str, ftype) -> None:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    w.add_type(gguf.GGUFType.MODEL)
    # TextModel.set_gguf_parameters
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if arch == "cohere2":
        w.add_layer_norm_eps(cfg.layer_norm_eps)
    else:
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "granitemoe":
        w.add_expert_count(cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    if arch == "glm4":  # config.json has head_dim (Granite's converter pops it)
        head_dim = cfg.head_dim
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(ftype)
    # the model classes' own
    if arch == "glm4":
        factor = cfg.rope_parameters.get("partial_rotary_factor", 0.5)
        w.add_rope_dimension_count(int(head_dim * factor))
    elif arch in ("granite", "granitemoe"):  # LlamaModel, then GraniteModel
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(head_dim)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_logit_scale(cfg.logits_scaling)
    else:  # Cohere2Model
        w.add_logit_scale(cfg.logit_scale)
        w.add_sliding_window(cfg.sliding_window)
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _converted(name: str, a: np.ndarray, cfg, arch: str):
    """(HF-side name the tensor map reads, data) after the model class's modify_tensors."""
    if arch in ("granite", "granitemoe") and name.endswith(("q_proj.weight", "q_proj.bias")):
        return [(name, _permute(a, cfg.num_attention_heads))]
    if arch in ("granite", "granitemoe") and name.endswith(("k_proj.weight", "k_proj.bias")):
        return [(name, _permute(a, cfg.num_key_value_heads))]
    if name.endswith(("block_sparse_moe.input_linear.weight", "experts.gate_up_proj")):
        base = name[: name.index("block_sparse_moe.")]
        gate, up = np.split(a, 2, axis=-2)
        return [
            (base + "mlp.experts.gate_proj.weight", np.ascontiguousarray(gate)),
            (base + "mlp.experts.up_proj.weight", np.ascontiguousarray(up)),
        ]
    if name.endswith("experts.down_proj"):
        return [(name.replace("block_sparse_moe.experts", "mlp.experts") + ".weight", a)]
    if name.endswith("block_sparse_moe.router.weight"):
        return [(name.replace("router.weight", "router.layer.weight"), a)]
    if arch == "cohere2" and name.endswith(".bias"):
        assert not a.any(), f"{name}: the converter refuses a nonzero bias"
        return []
    return [(name, a)]


def write_gguf(hf, tokenizer_dir: str, path: str, arch: str, qtype: str = "f32") -> str:
    """hf's weights as the converter writes them for `arch` (ARCHS) with --outtype qtype."""
    cfg = hf.config
    ftype = FTYPES[qtype]
    stored = ftype if qtype == "f32" else FTYPES["q8_0"]  # q4_k_m: Q4_K where Q8_0 would be
    w = gguf.GGUFWriter(path, arch)
    _header(w, cfg, arch, ftype)
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(ARCHS[arch], cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        for hf_name, a in _converted(name, t.float().numpy().copy(), cfg, arch):
            new_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            assert new_name is not None, f"the converter cannot map {hf_name}"
            raw, kind = _stored(new_name, _torch(a), stored, ARCHS[arch])
            if qtype == "q4_k_m" and kind == gguf.GGMLQuantizationType.Q8_0:
                raw, kind = _q4_k_m(new_name, a, raw, kind)
            w.add_tensor(new_name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _q4_k_m(name: str, a: np.ndarray, raw: np.ndarray, kind):
    """Q4_K for a matrix Q8_0 would store, unless it gets more bits or its rows do not fill
    256-value blocks."""
    import torch

    from radixlm.kernels.formats import quantize

    if name.endswith(MORE_BITS) or a.shape[-1] % 256:
        return raw, kind
    rows = a.reshape(-1, a.shape[-1])
    q = quantize(torch.from_numpy(np.ascontiguousarray(rows)), "q4_k").numpy()
    return q.reshape(*a.shape[:-1], q.shape[-1]), gguf.GGMLQuantizationType.Q4_K


def _torch(a: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def file_weights(path: str) -> dict:
    """The file's tensors as radixlm's loader yields them in float32 (its names are HF's, but for
    stacked experts and the router: gguf/spec.EXPERT_TENSOR_NAMES), every transform undone."""
    from radixlm.model.gguf.loader import gguf_config, gguf_weights
    from radixlm.model.gguf.reader import open_gguf

    reader = open_gguf(path)
    return dict(gguf_weights(reader, gguf_config(reader)))


def assert_file_holds(hf, path: str) -> None:
    """A float32 file read back holds hf's weights exactly, under hf's names (a q / k permutation
    left in place would not always show in the greedy tokens)."""
    import torch

    got = file_weights(path)
    want = {n: t for n, t in hf.state_dict().items() if n != "lm_head.weight" or n in got}
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert torch.equal(got[name].float(), t.float()), name
