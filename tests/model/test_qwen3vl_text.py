"""The text path of Qwen3-VL's and Qwen3-VL-MoE's checkpoints (Qwen3VLForConditionalGeneration,
Qwen3VLMoeForConditionalGeneration: model.language_model.*, a nested text_config, interleaved
M-RoPE, the MoE's experts stacked): a tiny random float32 checkpoint gives the HF model's greedy
tokens on text alone, batched and in prefill chunks smaller than the prompt, and the radix cache
stays exact (a second turn, a branch of a long cached prompt, evictions through a small pool); the
text model as llama.cpp's converter writes it (`qwen3vl` / `qwen3vlmoe`: Qwen3's tensors, the
experts split into ffn_{gate,up,down}_exps, plus rope.dimension_sections and n_deepstack_layers)
answers alike, and a Q8_0 file agrees with HF holding its dequantized weights on >= 95% of top-1
tokens; a file whose sections do not fill half the head, or with more DeepStack layers than
decoder layers, is refused by the key. Images:
tests/vision/test_qwen3vl_vs_hf.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from radixlm.model.loader import load_model
from tests.model.cache_checks import check_greedy_and_cache, check_greedy_and_evictions
from tests.model.helpers import randomize
from tests.model.hybrid_checkpoints import _add_vocab, _stored, tiny_tokenizer
from tests.model.windowed_checkpoints import VOCAB, check_greedy
from tests.vision.qwen3vl_checkpoint import tiny_qwen3vl_config

ARCHS = {
    False: ("Qwen3VLForConditionalGeneration", "qwen3vl", "Qwen3ForCausalLM"),
    True: ("Qwen3VLMoeForConditionalGeneration", "qwen3vlmoe", "Qwen3MoeForCausalLM"),
}


def _checkpoint(moe: bool, tmp_path_factory):
    """(path, the HF model) of a tiny random checkpoint written by save_pretrained."""
    tok = tiny_tokenizer()
    n = len(tok)
    # the vision tokens: ids the prompts (10 .. VOCAB) never hold
    ids = dict(
        zip(
            ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
            [n - 4, n - 3, n - 2, n - 1],
        )
    )
    # every MoE layer sparse: llama.cpp's qwen3vlmoe has no dense MLP tensors (nor the released
    # checkpoints a dense layer)
    more = dict(mlp_only_layers=[]) if moe else {}
    cfg = tiny_qwen3vl_config(n, ids, moe, eos_token_id=tok.eos_token_id, **more)
    torch.manual_seed(0)
    hf = getattr(transformers, ARCHS[moe][0])(cfg).float().eval()
    randomize(hf)
    if not cfg.tie_word_embeddings:
        with torch.no_grad():  # logits of a real model's spread: choices far from ties
            hf.lm_head.weight.mul_(8)
    path = str(tmp_path_factory.mktemp("qwen3vl-moe" if moe else "qwen3vl"))
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def family(request, tmp_path_factory):
    return request.param, *_checkpoint(request.param, tmp_path_factory)


def _text_state(hf) -> dict[str, torch.Tensor]:
    """The language model's tensors under a text model's names (what the converter keeps)."""
    out = {}
    for name, t in hf.state_dict().items():
        if name.startswith("model.language_model."):
            out["model." + name[len("model.language_model.") :]] = t
        elif name == "lm_head.weight" and not hf.config.tie_word_embeddings:
            out[name] = t
    return out


def write_text_gguf(
    hf, tokenizer_dir: str, path: str, qtype: str = "f32", sections=None, deepstack=None
) -> str:
    """hf's language model as convert_hf_to_gguf.py writes it (conversion/qwen3vl.py
    Qwen3VLTextModel / Qwen3VLMoeTextModel over Qwen3Model / Qwen3MoeModel), --outtype qtype."""
    import gguf

    cfg = hf.config.text_config
    moe = cfg.model_type == "qwen3_vl_moe_text"
    arch = ARCHS[moe][1]
    model_arch = getattr(gguf.MODEL_ARCH, arch.upper())
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    w = gguf.GGUFWriter(path, arch)
    w.add_type(gguf.GGUFType.MODEL)
    # TextModel.set_gguf_parameters
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    rope = cfg.rope_parameters
    w.add_rope_dimension_sections(sections or [*rope["mrope_section"], 0])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if moe:
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(ftype)
    if moe:  # Qwen2MoeModel
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    # Qwen3VLTextModel / Qwen3VLMoeTextModel
    if deepstack is None:
        deepstack = len(hf.config.vision_config.deepstack_visual_indexes)
    w.add_num_deepstack_layers(deepstack)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(w, tokenizer_dir, cfg.vocab_size, "qwen2")
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    tensors = []
    for name, t in _text_state(hf).items():
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H] in memory: gate rows, up rows
            base = name.removesuffix("gate_up_proj")
            gate, up = t.chunk(2, dim=1)
            tensors += [(base + "gate_proj.weight", gate), (base + "up_proj.weight", up)]
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]: the converter's permuted one
            tensors.append((name + ".weight", t))
        else:
            tensors.append((name, t))
    for name, t in tensors:
        gname = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        a = np.ascontiguousarray(t.float().numpy())
        data, dtype = _stored(gname, torch.from_numpy(a), ftype, model_arch)
        w.add_tensor(gname, data, raw_dtype=dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_safetensors_greedy_and_cache_match_hf(family):
    """Alone, batched, in chunks; then (the dense one: the cache does not depend on the MLP) turn 2
    reuses turn 1, a branch at 512 of a cached 700-token prompt reuses >= 256 (cache_checks.py)."""
    moe, path, hf = family
    assert load_model(path).architecture == ARCHS[moe][0]
    if moe:  # a small pool: the invariant checks walk it every step
        check_greedy(path, hf, f"{ARCHS[moe][0]}, text", max_total_tokens=512)
    else:  # a pool of 2048 tokens, as cache_checks.check_cached_prefixes (invariant checks walk it)
        check_greedy_and_cache(path, hf, f"{ARCHS[moe][0]}, text", max_total_tokens=2048)


def test_gguf_greedy_and_evictions_match_hf(family, tmp_path):
    """The converter's layout: alone, batched, in chunks; then (the dense one) evictions through a
    small pool."""
    moe, path, hf = family
    gguf_path = write_text_gguf(hf, path, str(tmp_path / f"{ARCHS[moe][1]}.gguf"))
    assert load_model(gguf_path).architecture == ARCHS[moe][2]
    if moe:
        check_greedy(gguf_path, hf, f"{ARCHS[moe][1]} gguf", max_total_tokens=512)
    else:
        check_greedy_and_evictions(gguf_path, hf, f"{ARCHS[moe][1]} gguf")


def test_q8_0_gguf_agrees_with_hf_top1(family, tmp_path):
    from tests.hybrid.test_hybrid_gguf import hf_holding
    from tests.model.top1_agreement import top1_agreement

    moe, path, hf = family
    text = _text_model(hf, ARCHS[moe][2])
    q8 = write_text_gguf(hf, path, str(tmp_path / "q8_0.gguf"), "q8_0")
    agree, total = top1_agreement(q8, text, hf_holding(text, q8), VOCAB, new_tokens=80)
    print(f"{ARCHS[moe][1]} Q8_0: top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{ARCHS[moe][1]} Q8_0: top-1 agreement {agree}/{total}"


def _text_model(hf, text_cls: str):
    """HF's text model holding hf's language model (what the GGUF holds): with no image, Qwen3's
    plain RoPE is the interleaved M-RoPE of three equal positions."""
    cfg = hf.config.text_config.to_dict()
    for key in ("model_type", "architectures", "mrope_section", "rope_scaling"):
        cfg.pop(key, None)
    cfg["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": cfg["rope_parameters"]["rope_theta"],
    }
    cfg["tie_word_embeddings"] = hf.config.tie_word_embeddings
    if text_cls == "Qwen3MoeForCausalLM":
        cfg["norm_topk_prob"] = True
    conf_cls = text_cls.replace("ForCausalLM", "Config")
    text = getattr(transformers, text_cls)(getattr(transformers, conf_cls)(**cfg)).eval()
    text.load_state_dict(_text_state(hf), strict=not hf.config.tie_word_embeddings)
    return text


@pytest.mark.parametrize(
    "bad, key",
    [
        (dict(sections=[8, 4, 2, 0]), "rope.dimension_sections"),  # 14 of the head's 16 pairs
        (dict(deepstack=4), "n_deepstack_layers"),  # past the 3 decoder layers
    ],
)
def test_gguf_bad_keys_are_refused_by_name(family, tmp_path, bad, key):
    moe, path, hf = family
    file = write_text_gguf(hf, path, str(tmp_path / "bad.gguf"), **bad)
    with pytest.raises(ValueError, match=rf"{ARCHS[moe][1]}\.{key}"):
        load_model(file)


def test_more_deepstack_layers_than_decoder_layers_is_refused(family, tmp_path):
    """A config.json (random weights) whose vision tower feeds more decoder layers than there are:
    one ValueError naming the field."""
    import json

    moe, path, _ = family
    with open(f"{path}/config.json") as f:
        cfg = json.load(f)
    cfg["vision_config"]["deepstack_visual_indexes"] = [0, 1, 2, 3]
    cfg["vision_config"]["depth"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="deepstack_visual_indexes"):
        load_model(str(tmp_path / "config.json"))
