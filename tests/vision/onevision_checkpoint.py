"""A tiny random-weight LLaVA-OneVision written by transformers: a 2-layer SigLIP at 32 px (patch 8:
16 tokens per patch), the MLP projector, `image_newline` and a 2-layer Qwen2 decoder, with
LlavaOnevisionProcessor (its PIL image processor: anyres grids up to 64 x 96 px of 32 px patches
plus the whole image) and SmolLM2's tokenizer plus `<image>` / `<video>`. `anyres_max_2`: a grid
of more than two patches is interpolated down, as HF does past `anyres_max_9` on real images."""

from __future__ import annotations

import json

import torch

IMAGE_SIZE, PATCH = 32, 8
PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64], [32, 96], [96, 32]]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{"
    " m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    " %}<image>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_onevision(path: str, base_tokenizer_path: str) -> str:
    import transformers
    from transformers import (
        AutoTokenizer,
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
    )
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    from radixlm.engine.hf_processors import onevision_image_only

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    text = transformers.Qwen2Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
    )
    cfg = LlavaOnevisionConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="full",
        image_grid_pinpoints=PINPOINTS,
        vision_aspect_ratio="anyres_max_2",
    )
    torch.manual_seed(0)
    model = LlavaOnevisionForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # peaked logits: greedy choices far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25 if "language_model" in name or "lm_head" in name else 0.2)
        model.model.image_newline.normal_(0.0, 1.0)
    model.save_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE  # the processor's too (text-only chats use the tokenizer's)
    ip = LlavaOnevisionImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_grid_pinpoints=PINPOINTS
    )
    onevision_image_only()(
        image_processor=ip,
        tokenizer=tok,
        num_image_tokens=(IMAGE_SIZE // PATCH) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_2",
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(path)
    with open(f"{path}/processor_config.json") as f:
        saved = json.load(f)
    saved.update(processor_class="LlavaOnevisionProcessor")  # the class name its own saves
    with open(f"{path}/processor_config.json", "w") as f:
        json.dump(saved, f, indent=2)
    return path
