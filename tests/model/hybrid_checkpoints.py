"""Tiny random-weight hybrid checkpoints for the tests: HF Qwen3_5ForCausalLM,
Qwen3_5MoeForCausalLM and Qwen3NextForCausalLM (Gated DeltaNet + full attention; hidden 64, 4
layers: linear, linear, linear, full), NemotronHForCausalLM (Mamba-2, attention and MLP blocks:
M - * M - M), Lfm2ForCausalLM (short conv + attention: conv, full, conv, conv) and
Lfm2MoeForCausalLM (LFM2's layers, a dense MLP in layer 0 and MoEs after); float32, saved as
safetensors directories with a small Qwen-style BPE tokenizer, and the same weights as the GGUF
file llama.cpp's converter writes (Nemotron-H's and LFM2's: tests/model/ssm_gguf_writer.py).

write_gguf transcribes the converter (llama.cpp convert_hf_to_gguf.py, now conversion/qwen.py and
conversion/base.py) on its own, without radixlm's loader: TextModel / Qwen2MoeModel /
Qwen3NextModel.set_gguf_parameters for the metadata, _LinearAttentionVReorderBase and
Qwen3NextModel.modify_tensors for the tensors, gguf's TensorNameMap (what map_tensor_name uses) for
the names, ModelBase.prepare_tensors for each tensor's type, _set_vocab_gpt2 for the tokenizer.
Where it differs: the pre-tokenizer name is set ("qwen35" for Qwen3.5, "qwen2" for the others), not
found by hashing the tokenizer's output (a tiny tokenizer has no registered hash).

The weights are drawn with randomize() (norms around 1, biases nonzero), A_log as log(U(1, 16)) like
HF's init, and rounded to bfloat16's precision (real checkpoints are bf16): the converter's float32
`w + 1` of a norm is then exact, so the loader's `- 1` can be checked bit for bit.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import transformers

from tests.model import ssm_gguf_writer
from tests.model.helpers import randomize

ARCHITECTURES = {  # llama.cpp arch -> HF class
    "qwen35": "Qwen3_5ForCausalLM",
    "qwen35moe": "Qwen3_5MoeForCausalLM",
    "qwen3next": "Qwen3NextForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2moe": "Lfm2MoeForCausalLM",
}
_CONFIG_CLASSES = {
    "qwen35": "Qwen3_5TextConfig",
    "qwen35moe": "Qwen3_5MoeTextConfig",
    "qwen3next": "Qwen3NextConfig",
    "nemotron_h": "NemotronHConfig",
    "lfm2": "Lfm2Config",
    "lfm2moe": "Lfm2MoeConfig",
}
_MROPE = {  # Qwen3.5 checkpoints carry interleaved M-RoPE sections (of the rotary half: 8 / 2)
    "rope_type": "default",
    "rope_theta": 10_000_000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [2, 1, 1],
    "mrope_interleaved": True,
}
_MROPE_ARCHS = ("qwen35", "qwen35moe")
BASE = dict(
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],  # full_attention_interval 4
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # two V heads per K head: the V-head reordering is observable
)
_MOE = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)
CONFIGS = {
    "qwen35": dict(BASE, intermediate_size=96, tie_word_embeddings=True, rope_parameters=_MROPE),
    # V heads of 16 columns inside Q8_0's 32-value blocks: the file's tiled order is run as stored
    "qwen35moe": dict(BASE, **_MOE, linear_value_head_dim=16, rope_parameters=_MROPE),
    "qwen3next": dict(
        BASE,
        **_MOE,
        intermediate_size=96,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "partial_rotary_factor": 0.25,
        },
    ),
    # Every block type; 8 Mamba heads in 2 groups (n_groups > 1: the grouped norm and B/C per
    # group are observable); head_dim 32 != hidden / heads (the GGUF's key_length is read).
    "nemotron_h": dict(
        hidden_size=64,
        layers_block_type=[
            "linear_attention",
            "mlp",
            "full_attention",
            "linear_attention",
            "mlp",
            "linear_attention",
        ],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=96,
        mamba_num_heads=8,
        mamba_head_dim=8,
        n_groups=2,
        ssm_state_size=16,
        conv_kernel=4,
        layer_norm_epsilon=1e-5,
        max_position_embeddings=512,
        tie_word_embeddings=False,  # HF's NemotronH never ties its head
    ),
    "lfm2": dict(
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=["conv", "full_attention", "conv", "conv"],
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=144,  # the MLP: int(2 * 144 / 3) = 96, a multiple of 16
        block_multiple_of=16,
        conv_L_cache=3,
        max_position_embeddings=512,
    ),
    # 8 sigmoid-routed experts (top 2) after one dense layer; the expert_bias drawn (hf_model)
    "lfm2moe": dict(
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=["conv", "full_attention", "conv", "conv"],
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_dense_layers=1,
        num_experts=8,
        num_experts_per_tok=2,
        conv_L_cache=3,
        max_position_embeddings=512,
    ),
}


def tiny_tokenizer():
    """A Qwen2-style byte-level BPE (~900 tokens, ChatML specials, a ChatML chat template)."""
    from transformers import Qwen2Tokenizer

    from tests.model.test_gguf_tokenizers import CHAT_SPECIALS, QWEN2_SPLIT, _train_byte_bpe

    vocab, merges = _train_byte_bpe(QWEN2_SPLIT, CHAT_SPECIALS)
    tok = Qwen2Tokenizer(vocab=dict(vocab), merges=[tuple(m.split(" ")) for m in merges])
    tok.add_special_tokens({"additional_special_tokens": CHAT_SPECIALS[1:]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


# The families whose RMSNorms multiply by 1 + w (randomize draws norm weights around 1).
OFFSET_NORMS = ("qwen35", "qwen35moe", "qwen3next")


# The projections that write into the residual stream (attention's, the linear layers', the MLPs'
# and the experts' outputs).
RESIDUAL_WRITERS = (
    "o_proj.weight",
    "out_proj.weight",
    "down_proj.weight",
    "experts.down_proj",
    "feed_forward.w2.weight",  # LFM2's
)


def hf_model(arch: str, tokenizer, seed: int = 0, scaled_residual: bool = False, **changes):
    """A random float32 HF model of the llama.cpp architecture `arch` sized for `tokenizer`.

    scaled_residual: GPT-2's initialization, the residual writers scaled by 1 / sqrt(2 layers), so
    each block adds a small update to the stream as in a trained model. Without it every block
    rewrites the stream and the random model amplifies a small error some 25x through its layers
    (an activation's int8 rounding, 0.4%, becomes 10-14% of the last hidden state)."""
    vocab = len(tokenizer)
    if arch == "nemotron_h":  # the converter pads the vocabulary to a multiple of 8
        vocab = -(-vocab // 8) * 8
    cfg = getattr(transformers, _CONFIG_CLASSES[arch])(
        **{
            **CONFIGS[arch],
            "vocab_size": vocab,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **changes,
        }
    )
    cfg.architectures = [ARCHITECTURES[arch]]
    torch.manual_seed(seed)
    hf = getattr(transformers, ARCHITECTURES[arch])(cfg).to(torch.float32)
    randomize(hf)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):  # HF's init: A ~ U(0, 16); away from 0 for a finite log
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            if name == "lm_head.weight":
                # logits of a real model's spread (std ~8), not randomize's O(1): top-1 choices
                # far from ties, as greedy and quantization tests need
                p.mul_(8)
            if arch in OFFSET_NORMS and "norm" in name and "linear_attn.norm" not in name:
                # these norms multiply by 1 + w (HF inits w at 0): w around 0, not 1, or every
                # norm would double the stream and the random model turn chaotic
                p.sub_(1)
            if name == "model.embeddings.weight":  # Nemotron-H's: as randomize draws embed_tokens
                p.copy_(torch.randn(p.shape, generator=g))
            if name.endswith("mixer.dt_bias"):
                # Mamba-2's dt = softplus(dt + dt_bias) stays above time_step_min (HF clamps it
                # there on prompts, not in decode steps) and small enough for a long memory.
                p.copy_(torch.empty(p.shape).uniform_(-3, -1, generator=g))
            if scaled_residual and name.endswith(RESIDUAL_WRITERS):
                p.mul_((2 * cfg.num_hidden_layers) ** -0.5)
            p.copy_(p.bfloat16().float())
        for name, b in hf.named_buffers():
            if name.endswith("feed_forward.expert_bias"):  # LFM2-MoE's (HF leaves it at 0)
                # of the sigmoid scores' spread, so that it changes some choices
                b.copy_((0.1 * torch.randn(b.shape, generator=g)).bfloat16().float())
    return hf.eval()


def hybrid_checkpoint(arch: str, path: str, tokenizer=None, **changes):
    """(path, hf model): the model saved with save_pretrained beside its tokenizer."""
    tokenizer = tokenizer or tiny_tokenizer()
    hf = hf_model(arch, tokenizer, **changes)
    hf.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, hf


def write_gguf(
    hf,
    tokenizer_dir: str,
    path: str,
    qtype: str = "f32",
    legacy_qkvz: bool = False,
    mtp_layers: int = 0,
    overrides: dict | None = None,
    mtp: dict | None = None,
) -> str:
    """hf (a model of ARCHITECTURES, or a directory holding one) as llama.cpp's converter writes
    it, with --outtype qtype ("f32" or "q8_0"; gguf cannot quantize Q4_K, so no such option).
    legacy_qkvz: Qwen3-Next's in_proj_qkvz kept whole as ssm_in (older converters). mtp_layers: a
    random MTP block appended as _QwenMtpMixin does (Qwen3.5's nextn layers). mtp: the checkpoint's
    own `mtp.*` tensors (qwen35_mtp_checkpoint.mtp_tensors), converted as _QwenMtpMixin does (its
    renames, then the layer's own transforms), or Nemotron-3's (nemotron_mtp_checkpoint) as
    NemotronHModel does. overrides: llama.cpp name -> float32 array, or
    (bytes, GGMLQuantizationType), written instead."""
    import gguf

    if isinstance(hf, str):
        hf = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    cfg = hf.config
    arch = next(a for a, c in ARCHITECTURES.items() if c == cfg.architectures[0])
    if ssm_gguf_writer.is_moe(cfg):  # NemotronHModel: nemotron_h_moe
        arch = "nemotron_h_moe"
    ssm = arch in ssm_gguf_writer.SSM_ARCHS
    # the converter's hparams: AutoConfig.from_pretrained(dir).to_dict()
    hp = ssm_gguf_writer.hparams(cfg) if ssm else cfg.to_dict()
    state = hf.state_dict()
    if mtp and ssm:  # Nemotron-3's block: NemotronHModel folds it into one (ssm_gguf_writer)
        mtp_layers = 1
    elif mtp:
        state = {**state, **mtp_renamed(mtp, hp["num_hidden_layers"])}
        mtp_layers = 1 + max(int(n.split(".")[2]) for n in mtp if n.startswith("mtp.layers."))
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"tiny-{arch}")
    if ssm:
        ssm_gguf_writer.add_hparams(w, hp, arch, ftype, mtp_layers)
    else:
        _add_hparams(w, hp, arch, ftype, mtp_layers)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, tokenizer_dir, hp["vocab_size"], "qwen35" if arch in _MROPE_ARCHS else "qwen2")
    if arch.startswith("nemotron_h"):  # NemotronHModel.set_vocab: its tokenizer adds a BOS
        w.add_add_bos_token(True)
    model_arch = getattr(gguf.MODEL_ARCH, arch.upper())
    n_blocks = hp["num_hidden_layers"] + mtp_layers
    tensor_map = gguf.get_tensor_name_map(model_arch, n_blocks)
    if ssm:
        tensors = dict(ssm_gguf_writer.converted(hf.state_dict(), hp, arch, tensor_map))
        if mtp:
            tensors.update(ssm_gguf_writer.converted_mtp(mtp, hp))
    else:
        tensors = dict(_converted(state, hp, arch, tensor_map, legacy_qkvz))
    if mtp_layers and not mtp:
        tensors.update(_mtp_block(hp, mtp_layers))
    for name, data in tensors.items():
        if overrides and name in overrides:
            data = overrides[name]
            if isinstance(data, tuple):
                w.add_tensor(name, data[0], raw_dtype=data[1])
                continue
            data = torch.from_numpy(np.asarray(data, dtype=np.float32))
        raw, kind = _stored(name, data, ftype, model_arch)
        w.add_tensor(name, raw, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_hparams(w, hp: dict, arch: str, ftype, mtp_layers: int) -> None:
    # TextModel.set_gguf_parameters
    w.add_block_count(hp["num_hidden_layers"] + mtp_layers)  # _Qwen35MtpMixin counts MTP blocks
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    if hp.get("intermediate_size") is not None:
        w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp["num_key_value_heads"])
    rope = hp["rope_parameters"]
    if "mrope_section" in rope:
        w.add_rope_dimension_sections((list(rope["mrope_section"]) + [0, 0, 0, 0])[:4])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if hp.get("num_experts") is not None:
        w.add_expert_count(hp["num_experts"])
        w.add_expert_used_count(hp["num_experts_per_tok"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_file_type(ftype)
    # Qwen2MoeModel.set_gguf_parameters
    if hp.get("moe_intermediate_size") is not None:
        w.add_expert_feed_forward_length(hp["moe_intermediate_size"])
    if hp.get("shared_expert_intermediate_size") is not None:
        w.add_expert_shared_feed_forward_length(hp["shared_expert_intermediate_size"])
    # Qwen3NextModel.set_gguf_parameters: top-level hparams, which transformers 5.x's to_dict()
    # lacks for these two, so the converter's defaults apply (as they do here)
    w.add_ssm_conv_kernel(hp["linear_conv_kernel_dim"])
    w.add_ssm_state_size(hp["linear_key_head_dim"])
    w.add_ssm_group_count(hp["linear_num_key_heads"])
    w.add_ssm_time_step_rank(hp["linear_num_value_heads"])
    w.add_ssm_inner_size(hp["linear_value_head_dim"] * hp["linear_num_value_heads"])
    w.add_full_attention_interval(hp.get("full_attention_interval", 4))
    rope_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    w.add_rope_dimension_count(int(rope_dim * hp.get("partial_rotary_factor", 0.25)))
    if arch != "qwen3next" and "mrope_section" not in rope:  # _Qwen35MRopeMixin
        w.add_rope_dimension_sections([11, 11, 10, 0])
    if mtp_layers:  # _QwenMtpMixin (Qwen3-Next's too)
        w.add_nextn_predict_layers(mtp_layers)


def _add_vocab(w, tokenizer_dir: str, vocab_size: int, pre: str) -> None:
    """TextModel._set_vocab_gpt2 / get_vocab_base: ids past the tokenizer padded as [PAD{i}]."""
    import gguf
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    by_id = {i: t for t, i in tok.get_vocab().items()}
    added = tok.get_added_vocab()
    decoder = tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif token in added:
            looks_special = token.startswith("<|") and token.endswith("|>")
            special = decoder[i].special or looks_special
            tokens.append(token if special else token.replace("\u2581", " "))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(tokenizer_dir, load_merges=True).add_to_gguf(w)


def _reorder_v_heads(t, dim: int, num_k_heads: int, num_v_per_k: int, head_dim: int):
    # conversion/qwen.py, _LinearAttentionVReorderBase._reorder_v_heads, verbatim in effect
    shape = list(t.shape)
    dim = dim + len(shape) if dim < 0 else dim
    t = t.reshape(*shape[:dim], num_k_heads, num_v_per_k, head_dim, *shape[dim + 1 :])
    perm = list(range(t.dim()))
    perm[dim], perm[dim + 1] = perm[dim + 1], perm[dim]
    return t.permute(*perm).contiguous().reshape(*shape)


def _converted(state: dict, hp: dict, arch: str, tensor_map, legacy_qkvz: bool):
    """(llama.cpp name, float32 tensor) of each HF tensor, as modify_tensors yields them."""
    nk, nv = hp["linear_num_key_heads"], hp["linear_num_value_heads"]
    hk, hv = hp["linear_key_head_dim"], hp["linear_value_head_dim"]
    for name, t in state.items():
        if name == "lm_head.weight" and hp["tie_word_embeddings"]:
            continue  # save_pretrained leaves the tied head out, so the converter never sees it
        t = t.detach().float().clone()
        # _LinearAttentionVReorderBase.modify_tensors (Qwen3.5 only), before its super()'s
        if arch != "qwen3next" and nk != nv and "linear_attn." in name:
            r = nv // nk
            if ".in_proj_qkv." in name:
                q, k, v = t[: hk * nk], t[hk * nk : 2 * hk * nk], t[2 * hk * nk :]
                t = torch.cat([q, k, _reorder_v_heads(v, 0, nk, r, hv)], dim=0)
            elif ".in_proj_z." in name:
                t = _reorder_v_heads(t, 0, nk, r, hv)
            elif ".in_proj_b." in name or ".in_proj_a." in name:
                t = _reorder_v_heads(t, 0, nk, r, 1)
            elif ".A_log" in name or ".dt_bias" in name:
                t = _reorder_v_heads(t.unsqueeze(-1), 0, nk, r, 1).squeeze(-1)
            elif ".conv1d" in name:
                t = t.squeeze()
                qk = hk * nk * 2
                t = torch.cat([t[:qk], _reorder_v_heads(t[qk:], 0, nk, r, hv)], dim=0)
            elif ".out_proj." in name:
                t = _reorder_v_heads(t, 1, nk, r, hv)
        # Qwen3NextModel.modify_tensors
        if name.endswith(".A_log"):
            t = -torch.exp(t)
        elif name.endswith(".dt_bias"):
            name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        elif "conv1d" in name:
            t = t.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + 1
        if "in_proj_qkvz.weight" in name and not legacy_qkvz:
            bid = name.split(".")[2]
            split = [hk, hk, nv // nk * hv, nv // nk * hv]
            x = t.permute(1, 0).contiguous().view(-1, nk, sum(split))
            q, k, v, z = (p.contiguous().view(hp["hidden_size"], -1) for p in x.split(split, -1))
            yield f"blk.{bid}.attn_qkv.weight", torch.cat([q, k, v], -1).permute(1, 0).contiguous()
            yield f"blk.{bid}.attn_gate.weight", z.permute(1, 0).contiguous()
            continue
        # Qwen2MoeModel.modify_tensors: 5.x's stacked experts, gate_up_proj split in two
        if name.endswith("mlp.experts.gate_up_proj"):
            n_ff = t.shape[-2] // 2
            base = name.removesuffix(".gate_up_proj")
            yield tensor_map.get_name(f"{base}.gate_proj.weight", (".weight",)), t[:, :n_ff]
            yield tensor_map.get_name(f"{base}.up_proj.weight", (".weight",)), t[:, n_ff:]
            continue
        if name.endswith("mlp.experts.down_proj"):
            name += ".weight"
        new_name = tensor_map.get_name(name, try_suffixes=(".weight", ".bias")) or _nextn_name(name)
        assert new_name is not None, f"the converter cannot map {name}"
        yield new_name, t


# _QwenMtpMixin.filter_tensors: mtp.* (but mtp.layers.i.*) -> these of model.layers.{n}
_MTP_REMAP = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}
# the gguf-py tensor map's NEXTN_* entries (model.layers.{bid}.X -> blk.{bid}.nextn.Y), which the
# gguf installed here lacks for the qwen35 architectures (the peer tree's has them)
_NEXTN = {
    "eh_proj": "NEXTN_EH_PROJ",
    "enorm": "NEXTN_ENORM",
    "hnorm": "NEXTN_HNORM",
    "shared_head.norm": "NEXTN_SHARED_HEAD_NORM",
}


def mtp_renamed(mtp: dict, n_layers: int) -> dict:
    """The `mtp.*` tensors under the names _QwenMtpMixin.filter_tensors gives them."""
    out = {}
    for name, t in mtp.items():
        parts = name.split(".", 3)
        if len(parts) == 4 and parts[1] == "layers":
            out[f"model.layers.{n_layers + int(parts[2])}.{parts[3]}"] = t
        else:
            out[f"model.layers.{n_layers}.{_MTP_REMAP[parts[1]]}.{parts[2]}"] = t
    return out


def _nextn_name(name: str) -> str | None:
    import gguf

    parts = name.split(".")  # model.layers.{bid}.<module>.weight
    key = _NEXTN.get(".".join(parts[3:-1]))
    if parts[:2] != ["model", "layers"] or key is None:
        return None
    tensor = getattr(gguf.MODEL_TENSOR, key)
    return gguf.TENSOR_NAMES[tensor].format(bid=parts[2]) + "." + parts[-1]


def _stored(name: str, t: torch.Tensor, ftype, model_arch) -> tuple[np.ndarray, object]:
    """ModelBase.prepare_tensors: the type each tensor is written in, and its bytes."""
    import gguf
    from gguf import MODEL_TENSOR as T
    from gguf import GGMLQuantizationType as Q

    data = t.contiguous().numpy()
    bid = next((int(p) for p in name.split(".") if p.isdecimal()), None)
    always_f32 = any(  # match_model_tensor_name(new_name, key, bid) for the converter's list
        key in gguf.MODEL_TENSORS[model_arch]
        and bid is not None
        and name == gguf.TENSOR_NAMES[key].format(bid=bid) + ".weight"
        for key in (
            T.FFN_GATE_INP,
            T.FFN_GATE_INP_SHEXP,
            T.SSM_CONV1D,
            T.SHORTCONV_CONV,
            T.SSM_CONV1D_Q,  # Kimi's KDA convolutions
            T.SSM_CONV1D_K,
            T.SSM_CONV1D_V,
        )
    )
    if data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        qtype = Q.F32
    elif always_f32 or ftype == gguf.LlamaFileType.ALL_F32:
        qtype = Q.F32
    else:
        qtype = Q.Q8_0
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:  # a row no multiple of 32: the converter falls back to F16
        return gguf.quants.quantize(data, Q.F16), Q.F16


def _mtp_block(hp: dict, n: int) -> dict:
    """Random tensors of the MTP block(s) the converter appends (mtp.fc -> nextn.eh_proj, the
    pre_fc norms -> nextn.enorm / hnorm, mtp.layers.0 -> a full-attention layer)."""
    g = torch.Generator().manual_seed(99)
    h, hd = hp["hidden_size"], hp["head_dim"]
    shapes = {
        "nextn.eh_proj.weight": (h, 2 * h),
        "nextn.enorm.weight": (h,),
        "nextn.hnorm.weight": (h,),
        "nextn.shared_head_norm.weight": (h,),
        "attn_norm.weight": (h,),
        "attn_q.weight": (2 * hd * hp["num_attention_heads"], h),
        "attn_k.weight": (hd * hp["num_key_value_heads"], h),
        "attn_output.weight": (h, hd * hp["num_attention_heads"]),
    }
    base = hp["num_hidden_layers"]
    return {
        f"blk.{base + i}.{k}": torch.randn(s, generator=g)
        for i in range(n)
        for k, s in shapes.items()
    }


def expected_weights(hf) -> dict[str, torch.Tensor]:
    """hf's state dict under the names radixlm's GGUF loader yields: HF's own, but the stacked
    experts as gguf/loader names a GGUF's (mlp.experts.{gate,up,down}_proj.weight, [E, rows, cols];
    radixlm's MoE models take both) and no lm_head when it is tied."""
    out = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and hf.config.tie_word_embeddings:
            continue
        if name.endswith(("mlp.experts.gate_up_proj", "feed_forward.experts.gate_up_proj")):
            n_ff = t.shape[1] // 2
            out[name.replace("gate_up_proj", "gate_proj.weight")] = t[:, :n_ff]
            out[name.replace("gate_up_proj", "up_proj.weight")] = t[:, n_ff:]
        elif name.endswith(("mlp.experts.down_proj", "feed_forward.experts.down_proj")):
            out[name + ".weight"] = t
        else:
            out[name] = t
    return {k: v.detach().float() for k, v in out.items()}


def save_tokenizer(path: str, tokenizer=None) -> str:
    os.makedirs(path, exist_ok=True)
    (tokenizer or tiny_tokenizer()).save_pretrained(path)
    return path


def dequantized_as_q8_0(hf, kept_float: tuple[str, ...] = ()):
    """A copy of hf holding the weights a Q8_0 file of it stores, dequantized: every matrix in Q8_0
    blocks along its rows (as stored: the converter's transforms permute or stack rows, never
    mix them), float16 where a row is no multiple of 32; vectors, convolutions and the names
    ending in `kept_float` (the converter's float32 tensors: the router) as they are."""
    import copy

    held = copy.deepcopy(hf)
    with torch.no_grad():
        for name, p in held.named_parameters():
            if p.dim() >= 2 and "conv1d" not in name and not name.endswith(kept_float):
                p.copy_(q8_0_round_trip(p))
    return held.eval()


def q8_0_round_trip(t: torch.Tensor) -> torch.Tensor:
    """t as a Q8_0 file's rows store it (F16 where a row is no multiple of 32), back to float32."""
    import gguf
    from gguf.quants import dequantize, quantize

    a = t.detach().float().numpy()
    if a.shape[-1] % 32:
        return torch.from_numpy(a.astype(np.float16).astype(np.float32))
    q8 = gguf.GGMLQuantizationType.Q8_0
    out = np.array(dequantize(quantize(a, q8), q8), dtype=np.float32)
    return torch.from_numpy(out).reshape(t.shape)
