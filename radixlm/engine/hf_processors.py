"""The model's HF processor for images: AutoProcessor's, or, where transformers' processor needs its
video processor (torchvision, absent here), the same processor built for images only, with the PIL
image processor (Qwen2-VL / Qwen3-VL / Qwen3.5, Pixtral, SmolVLM, InternVL, LLaVA-OneVision;
Kimi-K2.5, whose PIL image processor is radixlm's: engine/kimi_k25_image.py; LFM2-VL, whose only
image processor is a torchvision one: radixlm's, engine/lfm2_vl_image.py).
engine/mm_processor.py runs it over a prompt's images.
"""

from __future__ import annotations

# model_type -> the processor transformers builds for it, as (module, class), when that processor
# needs its video processor (torchvision): radixlm builds it for images only (_image_processor).
IMAGE_ONLY_PROCESSORS = {
    "qwen2_vl": ("qwen2_vl.processing_qwen2_vl", "Qwen2VLProcessor"),
    "qwen2_5_vl": ("qwen2_vl.processing_qwen2_vl", "Qwen2VLProcessor"),
    "qwen3_5": ("qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_5_moe": ("qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_vl": ("qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_vl_moe": ("qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
    "glm4v": ("glm4v.processing_glm4v", "Glm4vProcessor"),
    "glm4v_moe": ("glm4v.processing_glm4v", "Glm4vProcessor"),
    "glm46v": ("glm46v.processing_glm46v", "Glm46VProcessor"),
}
# model_type -> its PIL image processor, as (module, class), where it is not Qwen2-VL's
PIL_IMAGE_PROCESSORS = {
    "glm4v": ("glm4v.image_processing_pil_glm4v", "Glm4vImageProcessorPil"),
    "glm4v_moe": ("glm4v.image_processing_pil_glm4v", "Glm4vImageProcessorPil"),
    "glm46v": ("glm46v.image_processing_pil_glm46v", "Glm46VImageProcessorPil"),
}


def load_hf_processor(model_path: str):
    """The model's HF processor: AutoProcessor's, except for Qwen2-VL / Qwen2.5-VL / Qwen3.5 /
    Qwen3-VL / GLM-4V, whose processors need their video processor (torchvision): the same
    processor for images only, with the PIL image processor.
    """
    import importlib

    from transformers import AutoConfig, AutoProcessor

    model_type = AutoConfig.from_pretrained(model_path).model_type
    if model_type == "mistral3":
        return _pixtral_processor(model_path)
    if model_type == "smolvlm":
        return _smolvlm_processor(model_path)
    if model_type == "internvl":
        return _internvl_processor(model_path)
    if model_type == "llava_onevision":
        return _onevision_processor(model_path)
    if model_type == "kimi_k25":
        return kimi_k25_image_only().from_pretrained(model_path)
    if model_type == "lfm2_vl":
        return lfm2_vl_processor().from_pretrained(model_path)
    known = IMAGE_ONLY_PROCESSORS.get(model_type)
    if known is None:
        return AutoProcessor.from_pretrained(model_path)
    module, name = PIL_IMAGE_PROCESSORS.get(
        model_type, ("qwen2_vl.image_processing_pil_qwen2_vl", "Qwen2VLImageProcessorPil")
    )
    pil = getattr(importlib.import_module(f"transformers.models.{module}"), name)
    proc = _image_processor(*known).from_pretrained(model_path)
    if not isinstance(proc.image_processor, pil):  # the fast one may differ in the last bits
        proc.image_processor = pil.from_pretrained(model_path)
    return proc


def _pixtral_processor(model_path: str):
    """Mistral 3's PixtralProcessor with the PIL image processor. Its module imports the
    torchvision image processor's module for one helper (the token count of a size), which the PIL
    module has too: without torchvision that import is given the PIL module's helper."""
    import sys
    import types

    from transformers.models.pixtral import image_processing_pil_pixtral as pil

    name = "transformers.models.pixtral.image_processing_pixtral"
    try:
        import transformers.models.pixtral.image_processing_pixtral  # noqa: F401
    except ImportError:  # no torchvision
        shim = types.ModuleType(name)
        shim.get_resize_output_image_size = pil.get_resize_output_image_size
        sys.modules[name] = shim
    from transformers.models.pixtral.processing_pixtral import PixtralProcessor

    proc = PixtralProcessor.from_pretrained(model_path)
    if not isinstance(proc.image_processor, pil.PixtralImageProcessorPil):
        proc.image_processor = pil.PixtralImageProcessorPil.from_pretrained(model_path)
    return proc


def _smolvlm_processor(model_path: str):
    """SmolVLM's processor for images only (its video processor needs torchvision), with the PIL
    image processor."""
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    proc = smolvlm_image_only().from_pretrained(model_path)
    if not isinstance(proc.image_processor, SmolVLMImageProcessorPil):
        proc.image_processor = SmolVLMImageProcessorPil.from_pretrained(model_path)
    return proc


def _internvl_processor(model_path: str):
    """InternVL's processor for images only (its video processor needs torchvision), with the PIL
    image processor (GotOcr2's: the same tiles and thumbnail as the torchvision one)."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        GotOcr2ImageProcessorPil,
    )

    proc = internvl_image_only().from_pretrained(model_path)
    if not isinstance(proc.image_processor, GotOcr2ImageProcessorPil):
        proc.image_processor = GotOcr2ImageProcessorPil.from_pretrained(model_path)
    return proc


def internvl_image_only() -> type:
    """InternVLProcessor without its video processor."""
    base = _image_processor("internvl.processing_internvl", "InternVLProcessor")

    class InternVLImageOnly(base):
        # named, so that from_pretrained passes the saved values on
        def __init__(
            self,
            image_processor=None,
            tokenizer=None,
            image_seq_length=256,
            chat_template=None,
            **kwargs,
        ):
            super().__init__(
                image_processor,
                tokenizer,
                image_seq_length=image_seq_length,
                chat_template=chat_template,
                **kwargs,
            )

    return InternVLImageOnly


def _onevision_processor(model_path: str):
    """LLaVA-OneVision's processor for images only (its video processor needs torchvision), with
    the PIL image processor."""
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil as Pil,
    )

    proc = onevision_image_only().from_pretrained(model_path)
    if not isinstance(proc.image_processor, Pil):
        proc.image_processor = Pil.from_pretrained(model_path)
    return proc


def onevision_image_only() -> type:
    """LlavaOnevisionProcessor without its video processor."""
    base = _image_processor("llava_onevision.processing_llava_onevision", "LlavaOnevisionProcessor")

    class LlavaOnevisionImageOnly(base):
        # A prompt's images as one sample: with two or more, HF's OneVision encodes each image
        # whole (no anyres grid), as its chat template's processing does.
        nested_images = True

        # named, so that from_pretrained passes the saved values on
        def __init__(
            self,
            image_processor=None,
            tokenizer=None,
            num_image_tokens=None,
            vision_feature_select_strategy=None,
            vision_aspect_ratio="anyres_max_9",
            chat_template=None,
            **kwargs,
        ):
            super().__init__(
                image_processor,
                tokenizer,
                num_image_tokens=num_image_tokens,
                vision_feature_select_strategy=vision_feature_select_strategy,
                vision_aspect_ratio=vision_aspect_ratio,
                chat_template=chat_template,
                **kwargs,
            )

    return LlavaOnevisionImageOnly


def kimi_k25_image_only() -> type:
    """Kimi_K25Processor without its video processor (torchvision), with radixlm's PIL image
    processor (engine/kimi_k25_image.py: transformers has only a torchvision one, so
    AutoImageProcessor cannot build it here): its text expansion (each <|media_pad|> into its
    grid's tokens) is transformers'."""
    from radixlm.engine.kimi_k25_image import Kimi_K25ImageProcessorPil

    base = _image_processor("kimi_k25.processing_kimi_k25", "Kimi_K25Processor")

    class Kimi_K25ImageOnly(base):
        @classmethod
        def _get_arguments_from_pretrained(cls, path, processor_dict=None, **kwargs):
            from transformers import AutoTokenizer

            return [
                Kimi_K25ImageProcessorPil.from_pretrained(path),
                AutoTokenizer.from_pretrained(path),
            ]

    return Kimi_K25ImageOnly


def smolvlm_image_only() -> type:
    """SmolVLMProcessor without its video processor. Its video prompt alone writes a frame count in
    words (num2words), which the processor demands at construction: without the package, that
    function is one that refuses videos (radixlm serves none); image prompts never call it."""
    from transformers.models.smolvlm import processing_smolvlm as smol

    if smol.num2words is None:

        def num2words(n):
            raise ImportError("SmolVLM's video prompts need num2words; radixlm serves images only")

        smol.num2words = num2words
    base = _image_processor("smolvlm.processing_smolvlm", "SmolVLMProcessor")

    class SmolVLMImageOnly(base):
        # named, so that from_pretrained passes the saved values on (the chat template too)
        def __init__(
            self,
            image_processor=None,
            tokenizer=None,
            image_seq_len=169,
            chat_template=None,
            **kwargs,
        ):
            super().__init__(
                image_processor,
                tokenizer,
                image_seq_len=image_seq_len,
                chat_template=chat_template,
                **kwargs,
            )

    return SmolVLMImageOnly


def lfm2_vl_processor() -> type:
    """Lfm2VlProcessor (transformers' text expansion: <|image_start|>, a <|img_row_r_col_c|> and
    its run per tile, <|img_thumbnail|> and its run, <|image_end|>) with radixlm's image processor
    (engine/lfm2_vl_image.py): transformers' only one needs torchvision."""
    from transformers import AutoTokenizer
    from transformers.models.lfm2_vl.processing_lfm2_vl import Lfm2VlProcessor

    from radixlm.engine.lfm2_vl_image import Lfm2VlImageProcessorNoTorchvision as Images

    class Lfm2VlImageOnly(Lfm2VlProcessor):
        @classmethod
        def _get_arguments_from_pretrained(cls, path, processor_dict=None, **kwargs):
            return [Images.from_pretrained(path), AutoTokenizer.from_pretrained(path)]

    return Lfm2VlImageOnly


def _image_processor(module: str, name: str) -> type:
    import importlib

    base = getattr(importlib.import_module(f"transformers.models.{module}"), name)

    class ImageOnly(base):
        """The processor without its video processor: transformers' text expansion (each
        <|image_pad|> into its grid's tokens) and image processor, unchanged."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(
                image_processor,
                tokenizer,
                video_processor=None,
                chat_template=chat_template,
                **kwargs,
            )

    ImageOnly.__name__ = ImageOnly.__qualname__ = f"_ImageOnly{name}"
    return ImageOnly
