"""A tiny random-weight LLaVA (2-layer CLIP at 32 px + MLP projector + 2-layer Llama) with HF's
LlavaProcessor (a CLIPImageProcessor and SmolLM2's tokenizer plus an `<image>` token), built in code
and saved as a HF directory: the reference every vision test compares against."""

from __future__ import annotations

import io
import json

import numpy as np
import torch

IMAGE_SIZE, PATCH = 32, 8  # 16 patches: 16 image tokens per image ("default": the CLS dropped)


def write_tiny_llava(
    path: str,
    base_tokenizer_path: str,
    image_size: int = IMAGE_SIZE,
    patch: int = PATCH,
    vision: dict | None = None,
    text: dict | None = None,
) -> str:
    """vision / text: CLIPVisionConfig / LlamaConfig fields over the tiny ones (benchmarks/vision.py
    writes a LLaVA-1.5-shaped one)."""
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_token_id = tok.convert_tokens_to_ids("<image>")
    text = LlamaConfig(
        **{
            **dict(
                vocab_size=len(tok),
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=1024,
                bos_token_id=1,
                eos_token_id=2,
                initializer_range=0.25,
            ),
            **(text or {}),
        }
    )
    vision = CLIPVisionConfig(
        **{
            **dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                image_size=image_size,
                patch_size=patch,
                projection_dim=32,
            ),
            **(vision or {}),
        }
    )
    cfg = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=image_token_id,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # peaked logits (as tiny_model_dir): greedy choices far from ties
        for p in model.model.language_model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25)
        for p in list(model.model.multi_modal_projector.parameters()) + list(
            model.model.vision_tower.parameters()
        ):
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
        model.lm_head.weight.normal_(0.0, 0.25)
    model.save_pretrained(path)
    ip = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    proc = LlavaProcessor(
        image_processor=ip,
        tokenizer=tok,
        patch_size=patch,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=(
            "{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}"
            "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == "
            "'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
            "\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
        ),
    )
    proc.save_pretrained(path)  # its tokenizer too (the chat template is the processor's)
    return path


def png_bytes(seed: int, size: tuple[int, int] = (40, 36)) -> bytes:
    """A random RGB PNG (distinct per seed)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def hf_greedy(hf, text: str, images, n: int, one_sample: bool = False):
    """HF's greedy continuation of `text` with the images [(seed, size)] drawn by png_bytes: (its n
    tokens, their log-softmax rows). hf: (model, processor). one_sample: the prompt's images passed
    as one sample, as HF's chat-template processing passes them (LLaVA-OneVision)."""
    from PIL import Image

    model, proc = hf
    pil = [Image.open(io.BytesIO(png_bytes(s, size))).convert("RGB") for s, size in images]
    batch = [pil] if one_sample else pil
    inputs = proc(text=text, images=batch if pil else None, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=n,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out.sequences[0, inputs["input_ids"].shape[1] :].tolist(), [
        torch.log_softmax(s[0].float(), -1) for s in out.scores
    ]


def assert_matches_hf(out: dict, tokens: list[int], logprobs) -> None:
    """An Engine output (return_logprob, top_logprobs_num) against HF's greedy tokens and each
    step's log-softmax: the tokens equal, every reported logprob within 1e-4."""
    assert out["output_ids"] == tokens
    for step, ((lp, tid, _), top) in enumerate(
        zip(out["meta_info"]["output_token_logprobs"], out["meta_info"]["output_top_logprobs"])
    ):
        assert abs(lp - logprobs[step][tid].item()) < 1e-4, step
        for lp_k, tid_k, _ in top:
            assert abs(lp_k - logprobs[step][tid_k].item()) < 1e-4, step


def write_tiny_idefics3(path: str, base_tokenizer_path: str, family: str = "Idefics3") -> str:
    """A tiny Idefics3 (SmolVLM's architecture): 2-layer SigLIP at 32 px (patch 8, pixel shuffle 2:
    4 tokens per tile), images up to 64 px split into 32 px tiles plus the whole image, a 2-layer
    Llama. family "SmolVLM": the same written by transformers' SmolVLM classes, with SmolVLM's
    processor (saved without a video processor: that one needs torchvision)."""
    import importlib

    import transformers
    from transformers import AutoTokenizer, LlamaConfig

    module = importlib.import_module(
        f"transformers.models.{family.lower()}.image_processing_pil_{family.lower()}"
    )
    image_processor_cls = getattr(module, f"{family}ImageProcessorPil")

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens(
        {
            "additional_special_tokens": [
                "<fake_token_around_image>",
                "<image>",
                "<end_of_utterance>",
                "<global-img>",
                *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
            ]
        }
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = getattr(transformers, f"{family}VisionConfig")(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
    )
    cfg = getattr(transformers, f"{family}Config")(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForConditionalGeneration")(cfg).eval()
    with torch.no_grad():  # peaked logits: greedy choices far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.25 if "text_model" in name or "lm_head" in name else 0.2)
    model.save_pretrained(path)
    ip = image_processor_cls(
        size={"longest_edge": 2 * IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
        do_image_splitting=True,
    )
    if family == "SmolVLM":
        from radixlm.engine.hf_processors import smolvlm_image_only

        processor_cls = smolvlm_image_only()
    else:
        processor_cls = transformers.Idefics3Processor
    processor_cls(image_processor=ip, tokenizer=tok, image_seq_len=4).save_pretrained(path)
    if family == "SmolVLM":  # the class name SmolVLMProcessor itself saves
        import json

        with open(f"{path}/processor_config.json") as f:
            saved = json.load(f)
        saved.update(processor_class="SmolVLMProcessor")
        with open(f"{path}/processor_config.json", "w") as f:
            json.dump(saved, f, indent=2)
    return path


QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_PATCH, QWEN_MERGE = 4, 2  # 8 px per decoder token: a 40x36 image is a 5x4 grid (20 tokens)
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{"
    " m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image'"
    " %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor"
    " %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{%"
    " endif %}"
)


def write_tiny_qwen2vl(
    path: str,
    base_tokenizer_path: str,
    v2_5: bool = False,
    vision: dict | None = None,
    text: dict | None = None,
    max_pixels: int = 64 * 64,
) -> str:
    """A tiny random Qwen2-VL (v2_5: Qwen2.5-VL, window attention in the ViT) as its checkpoints
    come: config + safetensors, preprocessor_config.json (Qwen2VLImageProcessor: patch 4, merge 2,
    images resized to 8 px multiples between 16x16 and max_pixels), the tokenizer with Qwen's vision
    tokens and chat_template.json. A 2-layer ViT, a 2-layer Qwen2 decoder with M-RoPE (mrope_section
    2, 3, 3). vision / text: config fields over the tiny ones (benchmarks/vision.py writes a
    Qwen2-VL-2B ViT).
    """
    import json

    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = AutoTokenizer.from_pretrained(base_tokenizer_path)
    tok.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_TOKENS}
    text = {
        **dict(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            bos_token_id=1,
            eos_token_id=2,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [2, 3, 3],
                "rope_theta": 10000.0,
            },
        ),
        **(text or {}),
    }
    patch = (vision or {}).get("patch_size", QWEN_PATCH)
    base = dict(
        depth=2, num_heads=4, patch_size=patch, spatial_merge_size=QWEN_MERGE, temporal_patch_size=2
    )
    if v2_5:
        from transformers import (
            Qwen2_5_VLConfig as Config,
        )
        from transformers import (
            Qwen2_5_VLForConditionalGeneration as Model,
        )

        vision = {
            **base,
            **dict(
                hidden_size=32,
                intermediate_size=64,
                out_hidden_size=text["hidden_size"],
                window_size=2 * patch * QWEN_MERGE,
                fullatt_block_indexes=[1],
            ),
            **(vision or {}),
        }
    else:
        from transformers import Qwen2VLConfig as Config
        from transformers import Qwen2VLForConditionalGeneration as Model

        vision = {
            **base,
            **dict(embed_dim=32, hidden_size=text["hidden_size"], mlp_ratio=2),
            **(vision or {}),
        }
    cfg = Config(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Model(cfg).eval()
    with torch.no_grad():  # peaked logits: greedy choices far from ties
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2 if "visual" in name else 0.25)
    model.save_pretrained(path)
    ip = Qwen2VLImageProcessorPil(
        patch_size=patch,
        merge_size=QWEN_MERGE,
        temporal_patch_size=2,
        min_pixels=16 * 16,
        max_pixels=max_pixels,
    )
    ip.save_pretrained(path)
    tok.save_pretrained(path)
    with open(f"{path}/chat_template.json", "w") as f:
        json.dump({"chat_template": QWEN_CHAT_TEMPLATE}, f)
    return path


def save_qwen_vl_files(path: str, tok) -> None:
    """The image processor, tokenizer and chat template a tiny Qwen3-VL / Qwen3.5-VL directory
    holds beside its weights (Qwen2-VL's processor, 16 x 16 to 64 x 64 pixel images)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(
        patch_size=QWEN_PATCH,
        merge_size=QWEN_MERGE,
        temporal_patch_size=2,
        min_pixels=16 * 16,
        max_pixels=64 * 64,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    ).save_pretrained(path)
    tok.chat_template = QWEN_CHAT_TEMPLATE  # the tokenizer's (text-only chats) is the processor's
    tok.save_pretrained(path)
    with open(f"{path}/chat_template.json", "w") as f:
        json.dump({"chat_template": QWEN_CHAT_TEMPLATE}, f)
