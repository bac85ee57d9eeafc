"""A tiny random float32 Gemma 3n checkpoint saved as the released ones are
(Gemma3nForConditionalGeneration: model.language_model.* tensors, a tied head, a config of
model_type gemma3n nesting text / vision / audio configs), with its text weights taken from HF's
Gemma3nForCausalLM (the reference; HF's multimodal model needs timm for its vision tower).

The text model exercises every piece: 5 layers sliding / full (window WINDOW, so every prompt and
answer crosses it) with their own RoPE bases, the last two reading layers 2's and 1's KV, Gaussian
top-k activation sparsity on three layers, per-layer MLP widths, 4 AltUp copies, Laurel, per-layer
inputs from a table smaller than the vocabulary (ids past it read row 0), soft-capped logits; the
head tied to the embedding as released, or (tie_word_embeddings=False) a head of its own, whose
random answers do not settle on repeating one token as a tied random one's do. The
file also holds what the released ones carry and radixlm skips: tensors of the vision and audio
towers and the shared layers' unused k/v projections."""

from __future__ import annotations

import os

import torch
import transformers
from safetensors.torch import save_file

from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import tiny_tokenizer
from tests.model.windowed_checkpoints import WINDOW

TEXT = dict(
    hidden_size=64,
    intermediate_size=[128, 96, 128, 64, 128],
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"] * 1
    + ["sliding_attention", "full_attention"],
    sliding_window=WINDOW,
    num_kv_shared_layers=2,
    activation_sparsity_pattern=[0.95, 0.0, 0.6, 0.95, 0.0],
    laurel_rank=8,
    altup_num_inputs=4,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=512,  # below the prompts' ids up to 800: row 0 for those
    final_logit_softcapping=30.0,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
)

# What a release holds beside the language model (radixlm reads none of it).
TOWERS = {
    "model.vision_tower.timm_model.conv_stem.conv.weight": (8, 3, 3, 3),
    "model.embed_vision.embedding.weight": (16, 64),
    "model.audio_tower.subsample_conv_projection.conv_0.conv.weight": (8, 1, 3, 3),
    "model.embed_audio.embedding_projection.weight": (64, 32),
}


def text_config(tok, **overrides) -> transformers.Gemma3nTextConfig:
    return transformers.Gemma3nTextConfig(
        **{**TEXT, **overrides},
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )


def gemma3n_checkpoint(
    path: str, full_ple_table: bool = False, **overrides
) -> transformers.PreTrainedModel:
    """The checkpoint saved at path with the tiny tokenizer; returns HF's Gemma3nForCausalLM of the
    same text weights. full_ple_table: a per-layer table of the whole vocabulary (where the GGUF's,
    padded with zeros by the converter, reads as HF's)."""
    tok = tiny_tokenizer()
    if full_ple_table:
        overrides["vocab_size_per_layer_input"] = len(tok)
    cfg = text_config(tok, **overrides)
    cfg.architectures = ["Gemma3nForCausalLM"]
    torch.manual_seed(0)
    hf = transformers.Gemma3nForCausalLM(cfg).to(torch.float32)
    randomize(hf)  # (AltUp's correct_output_scale too: HF starts it at 0)
    if not cfg.tie_word_embeddings:
        with torch.no_grad():  # logits of a real model's spread: choices far from ties
            hf.lm_head.weight.mul_(8)
    hf.eval()
    g = torch.Generator().manual_seed(5)
    state = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight":  # (tied in the releases: absent from their files)
            if not cfg.tie_word_embeddings:
                state[name] = t.contiguous()
            continue
        state["model.language_model." + name[len("model.") :]] = t.contiguous()
    kv = cfg.num_key_value_heads * cfg.head_dim
    for i, mode in enumerate(cfg.kv_sharing_modes):
        if mode == "reuse":  # the releases keep them; HF ignores them
            prefix = f"model.language_model.layers.{i}.self_attn."
            for part, shape in (("k_proj", (kv, 64)), ("v_proj", (kv, 64)), ("k_norm", (16,))):
                state[prefix + part + ".weight"] = torch.randn(shape, generator=g)
    for name, shape in TOWERS.items():
        state[name] = torch.randn(shape, generator=g)
    os.makedirs(path, exist_ok=True)
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    full = transformers.Gemma3nConfig(text_config=cfg.to_dict())
    full.architectures = ["Gemma3nForConditionalGeneration"]
    full.save_pretrained(path)
    tok.save_pretrained(path)
    return hf


def write_gemma3n_gguf(
    hf: transformers.PreTrainedModel, tokenizer_dir: str, path: str, qtype: str = "f32"
) -> str:
    """hf as llama.cpp's converter writes it, --outtype qtype ("f32", or "q8_0" by its per-tensor
    type rules: hybrid_checkpoints._stored) (conversion/gemma.py Gemma3NModel on
    Gemma3Model and TextModel): per-layer widths as an array, the sliding layers' RoPE base as
    freq_base_swa, the layer pattern as flags, each layer's std multiplier
    (Normal(0, 1).icdf(sparsity), -inf where dense) as activation_sparsity_scale, the AltUp
    projections stacked, the per-layer table padded with zero rows to the vocabulary, the `_scale`
    vector named .weight, norms as they are; and the shared layers' k / v projections a release
    carries (random here: radixlm must skip them)."""
    import gguf

    from tests.model.hybrid_checkpoints import _add_vocab, _stored

    cfg = hf.config
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]

    def add(gname: str, t: torch.Tensor) -> None:
        data, dtype = _stored(gname, t.float(), ftype, gguf.MODEL_ARCH.GEMMA3N)
        w.add_tensor(gname, data, raw_dtype=dtype)

    n, arch = cfg.num_hidden_layers, "gemma3n"
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_block_count(n)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(list(cfg.intermediate_size))
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(ftype)
    w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_sliding_window(cfg.sliding_window)
    w.add_altup_active_idx(cfg.altup_active_idx)
    w.add_altup_num_inputs(cfg.altup_num_inputs)
    w.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input)
    w.add_shared_kv_layers(cfg.num_kv_shared_layers)
    normal = torch.distributions.normal.Normal(0, 1)
    w.add_activation_sparsity_scale(
        [
            normal.icdf(torch.tensor(s, dtype=torch.float32)).item()
            for s in cfg.activation_sparsity_pattern
        ]
    )
    w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3N, n)
    state = hf.state_dict()
    stacked = {"altup_projections": "altup_proj", "altup_unembed_projections": "altup_unembd_proj"}
    for part, gname in stacked.items():
        mats = [state.pop(f"model.{part}.{i}.weight") for i in range(cfg.altup_num_inputs - 1)]
        add(f"{gname}.weight", torch.stack(mats))
    g = torch.Generator().manual_seed(6)
    kv = cfg.num_key_value_heads * cfg.head_dim
    for i, mode in enumerate(cfg.kv_sharing_modes):
        if mode == "reuse":
            for part in ("attn_k", "attn_v"):
                add(f"blk.{i}.{part}.weight", torch.randn(kv, cfg.hidden_size, generator=g))
    for name, t in state.items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        if name == "model.embed_tokens_per_layer.weight" and t.shape[0] < cfg.vocab_size:
            t = torch.cat([t, t.new_zeros(cfg.vocab_size - t.shape[0], t.shape[1])])
        if name.endswith("_scale"):
            name += ".weight"  # (the converter's filter_tensors)
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise KeyError(f"no GGUF name for {name}")
        add(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
