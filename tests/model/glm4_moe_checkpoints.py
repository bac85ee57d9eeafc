"""A tiny random float32 GLM-4.5 (Glm4MoeForCausalLM) checkpoint for tests/model/test_glm4_moe.py:
saved by save_pretrained beside the tiny BPE tokenizer with one MTP layer's tensors added (as
GLM-4.5 ships them), and the same weights as llama.cpp's converter (Glm4MoeModel) writes them to
a `glm4moe` GGUF."""

from __future__ import annotations

import torch
import transformers

from tests.model.gguf_moe_writer import add_glm4moe_header, add_stacked_moe_tensors
from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import _add_vocab, tiny_tokenizer
from tests.model.test_gguf_archs import write_and_close

CONFIG = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    partial_rotary_factor=0.5,
    attention_bias=True,
    use_qk_norm=True,
    first_k_dense_replace=1,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=4,
    n_group=2,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    num_nextn_predict_layers=1,
    tie_word_embeddings=False,
)


def checkpoint(path: str):
    """The HF model, saved at path (safetensors per expert, tokenizer, an MTP layer); random weights
    everywhere (norms off 1, biases and the router's correction bias drawn) so that a mis-load
    shows."""
    tok = tiny_tokenizer()
    cfg = transformers.Glm4MoeConfig(
        **CONFIG, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=0
    )
    cfg.architectures = ["Glm4MoeForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.Glm4MoeForCausalLM(cfg).to(torch.float32)
    randomize(hf)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in hf.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.copy_(0.3 * torch.randn(8, generator=g))
        hf.lm_head.weight.mul_(8)  # logits of a real model's spread: greedy choices far from ties
    hf.eval().save_pretrained(path)
    tok.save_pretrained(path)
    _add_mtp_layer(path, hf)
    return hf


def _mtp_tensors(hf) -> dict[str, torch.Tensor]:
    """The MTP layer model.layers.<num_hidden_layers>.*: a copy of the last layer's tensors plus
    the MTP-only ones (stacked experts, as hf.state_dict() holds them)."""
    last, mtp = hf.config.num_hidden_layers - 1, hf.config.num_hidden_layers
    out = {
        name.replace(f".{last}.", f".{mtp}.", 1): t.clone()
        for name, t in hf.state_dict().items()
        if name.startswith(f"model.layers.{last}.")
    }
    h = hf.config.hidden_size
    out[f"model.layers.{mtp}.eh_proj.weight"] = torch.zeros(h, 2 * h)
    out[f"model.layers.{mtp}.enorm.weight"] = torch.ones(h)
    return out


def _add_mtp_layer(path: str, hf) -> None:
    from safetensors.torch import load_file, save_file

    file = f"{path}/model.safetensors"
    tensors = load_file(file)
    tensors.update(_mtp_tensors(hf))
    save_file(tensors, file, metadata={"format": "pt"})


def write_gguf(hf, tokenizer_dir: str, path: str) -> str:
    """hf as convert_hf_to_gguf.py's Glm4MoeModel writes it (float32; gguf_moe_writer.py):
    block_count counting the MTP layer, the experts stacked per projection
    (ffn_{gate,up,down}_exps), e_score_correction_bias as exp_probs_b.bias, no q/k permutation
    (NEOX RoPE)."""
    import gguf

    cfg = hf.config
    nextn = cfg.num_nextn_predict_layers
    w = gguf.GGUFWriter(path, "glm4moe")
    add_glm4moe_header(w, cfg, nextn)
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM4_MOE, cfg.num_hidden_layers + nextn)
    state = {**hf.state_dict(), **_mtp_tensors(hf)}
    add_stacked_moe_tensors(w, state, lambda name: _gguf_name(names, name))
    write_and_close(w)
    return path


def _gguf_name(names, hf_name: str) -> str:
    gname = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    assert gname is not None, hf_name
    return gname
