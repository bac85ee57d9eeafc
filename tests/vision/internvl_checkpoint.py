"""A tiny random-weight InternVL written by transformers: a 2-layer InternViT at 32 px (patch 8:
16 patches, pixel shuffle 0.5: 4 tokens per tile), the MLP projector and a 2-layer decoder, with
InternVLProcessor (GotOcr2's PIL image processor: images cropped into up to 4 tiles of 32 px plus
a thumbnail) and SmolLM2's tokenizer plus InternVL's image tokens."""

from __future__ import annotations

import json

import torch

IMAGE_SIZE, PATCH, SEQ = 32, 8, 4
TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{"
    " m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    " %}<IMG_CONTEXT>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# text: the decoder's model_type; vision: InternViT's variant (InternViT-300M: LayerNorm, no QK
# norm; InternViT-6B: RMSNorm with QK norm)
VARIANTS = {
    "qwen2": dict(norm_type="layer_norm", use_qk_norm=False),
    "qwen3": dict(norm_type="rms_norm", use_qk_norm=True),
}


def write_tiny_internvl(path: str, base_tokenizer_path: str, text_type: str = "qwen2") -> str:
    import transformers
    from transformers import AutoTokenizer, InternVLConfig, InternVLForConditionalGeneration
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    from radixlm.engine.hf_processors import internvl_image_only

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path, extra_special_tokens=TOKENS)
    text_cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[text_type]
    text = text_cls(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    vision = transformers.InternVLVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        **VARIANTS[text_type],
    )
    cfg = InternVLConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=SEQ,
        downsample_ratio=0.5,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = InternVLForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # peaked logits: greedy choices far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25 if "language_model" in name or "lm_head" in name else 0.2)
            elif "lambda" in name or "norm" in name:  # layer scale and norms away from 0.1 / 1
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE  # the processor's too (text-only chats use the tokenizer's)
    ip = GotOcr2ImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        crop_to_patches=True,
        min_patches=1,
        max_patches=4,
    )
    internvl_image_only()(
        image_processor=ip, tokenizer=tok, image_seq_length=SEQ, chat_template=CHAT_TEMPLATE
    ).save_pretrained(path)
    with open(f"{path}/processor_config.json") as f:
        saved = json.load(f)
    saved.update(processor_class="InternVLProcessor")  # the class name InternVL's own saves
    with open(f"{path}/processor_config.json", "w") as f:
        json.dump(saved, f, indent=2)
    return path
