"""Tiny random Gemma 3 (Gemma3ForConditionalGeneration) and Mistral 3
(Mistral3ForConditionalGeneration) checkpoints as their instruct releases come: config +
safetensors, the processor's files (Gemma3Processor with its PIL image processor;
PixtralProcessor) and the tokenizer with the family's image tokens. SmolLM2's tokenizer stands in
for the real vocabularies.
"""

from __future__ import annotations

import torch

GEMMA3_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
# SigLIP at 32 px, patch 8: 4x4 patches, pooled 2x2 into 4 image tokens per image.
GEMMA3_IMAGE, GEMMA3_PATCH, GEMMA3_TOKENS_PER_IMAGE = 32, 8, 4
EMBED_SCALE = 0.05
GEMMA3_WINDOW = 12  # the sliding layers' window: the prompts' second image ends past it
GEMMA3_CHAT_TEMPLATE = (
    "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{% if m['content'] is string %}{{"
    " m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    " %}<start_of_image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif"
    " %}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _randomize(model) -> None:
    """Every weight drawn (norms and biases too: a mis-loaded one shows), the vision side as the
    other tiny vision checkpoints; an untied head scaled to a real model's spread of logits."""
    from tests.model.helpers import randomize

    randomize(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "language_model" not in name and "lm_head" not in name:
                p.normal_(0.0, 0.2)
        if not model.config.get_text_config().tie_word_embeddings:
            model.lm_head.weight.mul_(8)
        else:  # Gemma's tied head: embeddings small beside what the layers add (else each token
            # predicts itself)
            model.get_input_embeddings().weight.mul_(EMBED_SCALE)


def write_tiny_gemma3(path: str, base_tokenizer_path: str) -> str:
    """A 4-layer Gemma 3 decoder (sliding layers 0-2, global layer 3, window 12), a 2-layer SigLIP,
    the projector's 2x2 average pool, soft-embedding norm and projection."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3Processor,
    )
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path, extra_special_tokens=GEMMA3_TOKENS)
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in GEMMA3_TOKENS.items()}
    text = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=GEMMA3_WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=1024,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=GEMMA3_IMAGE,
        patch_size=GEMMA3_PATCH,
        vision_use_head=False,
    )
    cfg = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(cfg).eval()
    _randomize(model)
    model.save_pretrained(path)
    ip = Gemma3ImageProcessorPil(size={"height": GEMMA3_IMAGE, "width": GEMMA3_IMAGE})
    Gemma3Processor(
        image_processor=ip,
        tokenizer=tok,
        image_seq_length=GEMMA3_TOKENS_PER_IMAGE,
        chat_template=GEMMA3_CHAT_TEMPLATE,
    ).save_pretrained(path)
    return path


MISTRAL3_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# Pixtral at patch 4 merged 2x2: one token per 8x8 pixels (a 40x36 image: 5 rows of 5 + a break).
MISTRAL3_PATCH, MISTRAL3_MERGE, MISTRAL3_LONGEST = 4, 2, 64
MISTRAL3_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}[INST]{% endif %}{% if m['content'] is"
    " string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    " %}[IMG]{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% if m['role'] =="
    " 'user' %}[/INST]{% endif %}{% endfor %}"
)


def write_tiny_mistral3(path: str, base_tokenizer_path: str) -> str:
    """A 2-layer Mistral decoder, a 2-layer Pixtral tower (images up to 64 px, patch 4), the
    projector's 2x2 patch merger and MLP."""
    from transformers import (
        AutoTokenizer,
        Mistral3Config,
        Mistral3ForConditionalGeneration,
    )
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    from radixlm.engine.hf_processors import load_hf_processor

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": MISTRAL3_TOKENS})
    text = dict(
        model_type="mistral",
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000_000.0},
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    vision = dict(
        model_type="pixtral",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=8,
        image_size=MISTRAL3_LONGEST,
        patch_size=MISTRAL3_PATCH,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
    )
    cfg = Mistral3Config(
        text_config=text,
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=MISTRAL3_MERGE,
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Mistral3ForConditionalGeneration(cfg).eval()
    _randomize(model)
    model.save_pretrained(path)
    PixtralImageProcessorPil(
        size={"longest_edge": MISTRAL3_LONGEST}, patch_size=MISTRAL3_PATCH
    ).save_pretrained(path)
    tok.chat_template = MISTRAL3_CHAT_TEMPLATE
    tok.save_pretrained(path)
    import json

    with open(f"{path}/chat_template.json", "w") as f:
        json.dump({"chat_template": MISTRAL3_CHAT_TEMPLATE}, f)
    with open(f"{path}/processor_config.json", "w") as f:
        json.dump(
            {
                "processor_class": "PixtralProcessor",
                "patch_size": MISTRAL3_PATCH,
                "spatial_merge_size": MISTRAL3_MERGE,
                "image_token": "[IMG]",
                "image_break_token": "[IMG_BREAK]",
                "image_end_token": "[IMG_END]",
            },
            f,
        )
    load_hf_processor(path)  # the server's own way of reading it
    return path
