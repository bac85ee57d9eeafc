"""A tiny random Qwen3-VL checkpoint (HF Qwen3VLForConditionalGeneration, or
Qwen3VLMoeForConditionalGeneration with moe=True) as its checkpoints come: config + safetensors
(the MoE's experts stacked and transposed, [E, hidden, 2 * inter] and [E, inter, hidden], as the
released files hold them), preprocessor_config.json
(Qwen2VLImageProcessor: patch 4, merge 2, 8 px per decoder token), the tokenizer with Qwen's vision
tokens and chat_template.json. Its decoder is Qwen3's (q / k norms) with interleaved M-RoPE
(mrope_section 4, 2, 2 over 16 rotary pairs: interleaved and sectioned layouts differ in every
part); its vision tower a 3-layer Qwen3-VL ViT with a learned 8x8 position grid and DeepStack
mergers after blocks 0 and 1, whose features join the first two decoder layers' hidden states at
the image tokens. The dense one ties its LM head (by the top level's tie_word_embeddings, as
transformers reads it), the MoE one does not and has a dense layer (mlp_only_layers)."""

from __future__ import annotations

import torch

from tests.vision.checkpoints import (
    QWEN_MERGE,
    QWEN_PATCH,
    QWEN_TOKENS,
    save_qwen_vl_files,
)

TEXT = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [8, 4, 4],
        "mrope_interleaved": True,
    },
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=[1])
VISION = dict(
    depth=3,
    hidden_size=32,
    intermediate_size=64,
    num_heads=4,
    patch_size=QWEN_PATCH,
    spatial_merge_size=QWEN_MERGE,
    temporal_patch_size=2,
    num_position_embeddings=64,
    deepstack_visual_indexes=[0, 1],
)


def tiny_qwen3vl_config(vocab_size: int, ids: dict[str, int], moe: bool = False, **text_config):
    import transformers

    text = dict(TEXT, vocab_size=vocab_size, bos_token_id=1, eos_token_id=2)
    if moe:
        text.update(MOE)
    text.update(text_config)
    name = "Qwen3VLMoe" if moe else "Qwen3VL"
    return getattr(transformers, f"{name}Config")(
        text_config=text,
        vision_config=dict(VISION, out_hidden_size=text["hidden_size"]),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=not moe,  # as Qwen3-VL-2B / 4B (tied) and the MoEs (not)
    )


def _released_expert_layout(path: str) -> None:
    """The experts' stacks as the released files hold them, [E, hidden, 2 * inter] and [E, inter,
    hidden] (save_pretrained writes transformers' in-memory [E, 2 * inter, hidden] / [E, hidden,
    inter]; both load, by shape)."""
    from safetensors.torch import load_file, save_file

    file = f"{path}/model.safetensors"
    state = load_file(file)
    for name in state:
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            state[name] = state[name].transpose(1, 2).contiguous()
    save_file(state, file, metadata={"format": "pt"})


def write_tiny_qwen3vl(path: str, base_tokenizer_path: str, moe: bool = False) -> str:
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_TOKENS}
    cfg = tiny_qwen3vl_config(len(tok), ids, moe)
    torch.manual_seed(0)
    name = "Qwen3VLMoe" if moe else "Qwen3VL"
    model = getattr(transformers, f"{name}ForConditionalGeneration")(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # peaked logits: greedy choices far from ties
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2 if "visual" in n else 0.25, generator=g)
            elif "norm" in n:
                p.normal_(1.0, 0.1, generator=g)
    model.save_pretrained(path)
    if moe:
        _released_expert_layout(path)
    save_qwen_vl_files(path, tok)
    return path
