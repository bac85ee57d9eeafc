"""The text path of Gemma 3's and Mistral 3's multimodal checkpoints
(Gemma3ForConditionalGeneration, Mistral3ForConditionalGeneration: model.language_model.*, lm_head,
a nested text_config): a tiny
random float32 checkpoint gives HF's greedy tokens alone, batched and in prefill chunks smaller than
the prompt; the language model as llama.cpp's converter writes it (`gemma3`: norms as 1 + w, five
sliding layers then a global one; `mistral3`: LlamaModel's layout, q / k rows permuted, a head size
apart from hidden / heads) answers alike; a Q8_0 file agrees with HF holding its dequantized weights
on >= 95% of top-1 tokens. The vision tower goes to the converter's separate mmproj file (not
read)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from radixlm.model.loader import load_model
from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import _add_vocab, _stored, tiny_tokenizer
from tests.model.windowed_checkpoints import VOCAB, WINDOW, _permute, check_greedy

TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # apart from hidden / heads (Mistral Small's 128 beside 5120 / 32)
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)
FAMILIES = {
    "gemma3": (
        "Gemma3Config",
        "Gemma3ForConditionalGeneration",
        "Gemma3ForCausalLM",
        dict(
            TEXT,
            model_type="gemma3_text",
            num_hidden_layers=6,  # llama.cpp's fixed pattern: five sliding layers, one global
            query_pre_attn_scalar=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        ),
        dict(model_type="siglip_vision_model", image_size=16, patch_size=8),
        dict(mm_tokens_per_image=4),
    ),
    "mistral3": (
        "Mistral3Config",
        "Mistral3ForConditionalGeneration",
        "MistralForCausalLM",
        dict(
            TEXT,
            model_type="mistral",
            num_hidden_layers=3,
            sliding_window=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1e9},
            tie_word_embeddings=False,
        ),
        dict(model_type="pixtral", image_size=16, patch_size=4, head_dim=8),
        dict(spatial_merge_size=2, tie_word_embeddings=False),
    ),
}
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)


def _text_model(mm, text_cls: str):
    """HF's text model holding mm's language model (what the converter keeps)."""
    text = getattr(transformers, text_cls)(mm.config.text_config).eval()
    state = {}
    for name, t in mm.state_dict().items():
        if name.startswith("model.language_model."):
            state["model." + name[len("model.language_model.") :]] = t
        elif name == "lm_head.weight":
            state[name] = t
    text.load_state_dict(state, strict=not text.config.tie_word_embeddings)
    return text


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    return _checkpoint(request.param, tmp_path_factory)


def _checkpoint(name: str, tmp_path_factory) -> tuple[str, str, transformers.PreTrainedModel]:
    cfg_cls, arch, text_cls, text, vision, extra = FAMILIES[name]
    tok = tiny_tokenizer()
    text = dict(text, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=0)
    cfg = getattr(transformers, cfg_cls)(
        text_config=text, vision_config=dict(VISION, **vision), image_token_index=3, **extra
    )
    torch.manual_seed(0)
    mm = getattr(transformers, arch)(cfg).eval()
    randomize(mm)
    if not cfg.text_config.tie_word_embeddings:
        with torch.no_grad():  # logits of a real model's spread: choices far from ties
            mm.lm_head.weight.mul_(8)
    path = str(tmp_path_factory.mktemp(name))
    mm.save_pretrained(path)
    tok.save_pretrained(path)
    return name, path, _text_model(mm, text_cls)


def write_text_gguf(
    hf, tokenizer_dir: str, path: str, arch: str, qtype: str = "f32", ministral3: bool = False
) -> str:
    """hf's weights as convert_hf_to_gguf.py writes the language model of the multimodal checkpoint
    (conversion/gemma.py Gemma3Model, conversion/mistral3.py Mistral3Model), --outtype qtype.
    ministral3: with the attention temperature scale a Ministral 3 file has."""
    import gguf

    cfg = hf.config
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    model_arch = getattr(gguf.MODEL_ARCH, arch.upper())
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(ftype)
    rope = cfg.rope_parameters
    if arch == "gemma3":  # the global layers' base and scaling; llama.cpp fixes the local base
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["full_attention"]["factor"])
        w.add_sliding_window(cfg.sliding_window)
    else:  # LlamaModel.set_gguf_parameters
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(cfg.head_dim)
        if ministral3:
            w.add_attn_temperature_scale(0.1)
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        a = t.float().numpy().copy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + 1  # Gemma3Model.norm_shift
        elif arch == "mistral3" and name.endswith("q_proj.weight"):
            a = _permute(a, cfg.num_attention_heads)
        elif arch == "mistral3" and name.endswith("k_proj.weight"):
            a = _permute(a, cfg.num_key_value_heads)
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        data, dtype = _stored(gname, torch.from_numpy(np.ascontiguousarray(a)), ftype, model_arch)
        w.add_tensor(gname, data, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_safetensors_greedy_matches_hf(family):
    name, path, hf = family
    assert load_model(path).architecture == FAMILIES[name][1]
    check_greedy(path, hf, f"{name} multimodal checkpoint, text")


def test_gguf_greedy_matches_hf(family, tmp_path):
    name, path, hf = family
    gguf_path = write_text_gguf(hf, path, str(tmp_path / f"{name}.gguf"), name)
    assert load_model(gguf_path).architecture == FAMILIES[name][2]
    check_greedy(gguf_path, hf, f"{name} gguf")


def test_ministral3_gguf_is_refused_by_its_key(tmp_path):
    """llama.cpp writes Ministral 3 as mistral3 too, with Llama 4's attention scaling and YaRN
    (read as Ministral3ForCausalLM: tests/model/test_ministral3.py); the scaling without YaRN is
    refused by its key."""
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path)
    cfg = transformers.MistralConfig(**dict(FAMILIES["mistral3"][3], vocab_size=len(tok)))
    hf = transformers.MistralForCausalLM(cfg).eval()
    bad = write_text_gguf(hf, str(tmp_path), str(tmp_path / "m.gguf"), "mistral3", ministral3=True)
    with pytest.raises(ValueError, match="mistral3.attention.temperature_scale"):
        load_model(bad)


@pytest.mark.parametrize(
    "name, change, field",
    [
        ("gemma3", {"text_config": {"use_bidirectional_attention": True}}, "use_bidirectional"),
        ("gemma3", {"mm_tokens_per_image": 3}, "mm_tokens_per_image"),
        ("gemma3", {"vision_config": {"model_type": "clip_vision_model"}}, "vision_config"),
        ("mistral3", {"text_config": {"model_type": "qwen2"}}, "text_config.model_type"),
        ("mistral3", {"vision_config": {"model_type": "siglip_vision_model"}}, "vision_config"),
    ],
)
def test_unsupported_variants_are_refused_naming_the_field(name, change, field, tmp_path):
    """A config.json (random weights) of each unsupported variant: one ValueError naming it."""
    import json

    cfg_cls, arch, _, text, vision, extra = FAMILIES[name]
    cfg = getattr(transformers, cfg_cls)(
        text_config=dict(text, vocab_size=64), vision_config=dict(VISION, **vision), **extra
    ).to_dict()
    for key, value in change.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    cfg["architectures"] = [arch]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=field):
        load_model(str(tmp_path / "config.json"))


def test_q8_0_gguf_agrees_with_hf_top1(family, tmp_path):
    from tests.hybrid.test_hybrid_gguf import hf_holding
    from tests.model.top1_agreement import top1_agreement

    name, path, hf = family
    q8 = write_text_gguf(hf, path, str(tmp_path / f"{name}-q8_0.gguf"), name, "q8_0")
    agree, total = top1_agreement(q8, hf, hf_holding(hf, q8), VOCAB, new_tokens=80)
    print(f"{name} Q8_0: top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{name} Q8_0: top-1 agreement {agree}/{total}"


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return _checkpoint("gemma3", tmp_path_factory)


def test_gemma3_radix_cache_stays_exact(gemma3):
    """Gemma 3's sliding layers through the window-aware cache (test_swa_cache's two checks): turn
    2 reuses turn 1, a branch at 512 of a cached 700-token prompt reuses >= 256, evictions through a
    small pool; HF's tokens. (Mistral 3's decoder is Mistral's, without a window.)"""
    from tests.model.test_swa_cache import test_cached_prefixes_stay_reusable as reuse
    from tests.model.test_swa_cache import test_eviction_through_a_small_pool as evict

    _, path, hf = gemma3
    reuse((path, hf))
    evict((path, hf))
