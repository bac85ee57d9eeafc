"""A tiny random-weight LFM2-VL written by transformers (Lfm2VlForConditionalGeneration): a 2-layer
SigLIP2 NaFlex tower (patch 4, a 4x4 learned position grid resampled to each tile's grid), the
projector (pixel unshuffle by 2, LayerNorm, Linear / GELU / Linear) and a 4-layer LFM2 decoder
(short convolutions and attention), the head tied to the embeddings as LFM2-VL's is. Its processor
is Lfm2VlProcessor with radixlm's image processor (engine/lfm2_vl_image.py; transformers' needs
torchvision): 4 to 16 tokens per image (8 px a token); an image past twice that is cut into 2 to 4
tiles of 32 px (16 tokens each) plus the smart-resized thumbnail. SmolLM2's tokenizer plus
LFM2-VL's image tokens."""

from __future__ import annotations

import json

import torch

PATCH, TILE = 4, 32
IMAGE_SETTINGS = dict(
    encoder_patch_size=PATCH,
    downsample_factor=2,
    tile_size=TILE,
    min_image_tokens=4,
    max_image_tokens=16,
    min_tiles=2,
    max_tiles=4,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)
SPECIALS = [
    "<image>",
    "<|image_start|>",
    "<|image_end|>",
    "<|img_thumbnail|>",
    *[f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)],
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{"
    " m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    " %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = dict(
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["conv", "full_attention", "conv", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=144,
    block_multiple_of=16,
    conv_L_cache=3,
    max_position_embeddings=1024,
    bos_token_id=1,
    eos_token_id=2,
)


def write_tiny_lfm2vl(path: str, base_tokenizer_path: str, **fields) -> str:
    """fields: Lfm2VlConfig fields over the tiny ones."""
    import transformers
    from transformers import AutoTokenizer

    from radixlm.engine.hf_processors import lfm2_vl_processor
    from radixlm.engine.lfm2_vl_image import Lfm2VlImageProcessorNoTorchvision

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    vision = transformers.Siglip2VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        patch_size=PATCH,
        num_patches=16,
        vision_use_head=False,
    )
    text = transformers.Lfm2Config(vocab_size=len(tok), **TEXT)
    cfg = transformers.Lfm2VlConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        projector_hidden_size=48,
        downsample_factor=2,
        **fields,
    )
    torch.manual_seed(0)
    model = transformers.Lfm2VlForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # peaked logits: greedy choices far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25 if "language_model" in name else 0.2)
            elif "norm" in name and "weight" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE  # the processor's too (text-only chats use the tokenizer's)
    ip = Lfm2VlImageProcessorNoTorchvision(**IMAGE_SETTINGS)
    lfm2_vl_processor()(
        image_processor=ip, tokenizer=tok, chat_template=CHAT_TEMPLATE
    ).save_pretrained(path)
    # the class names LFM2-VL's own files carry
    for name, key, value in (
        ("processor_config.json", "processor_class", "Lfm2VlProcessor"),
        ("preprocessor_config.json", "image_processor_type", "Lfm2VlImageProcessor"),
    ):
        try:
            with open(f"{path}/{name}") as f:
                saved = json.load(f)
        except FileNotFoundError:
            continue
        saved[key] = value
        if isinstance(saved.get("image_processor"), dict):
            saved["image_processor"]["image_processor_type"] = "Lfm2VlImageProcessor"
        with open(f"{path}/{name}", "w") as f:
            json.dump(saved, f, indent=2)
    return path
