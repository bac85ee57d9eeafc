"""A multimodal model's prompt: text with image placeholders plus images -> token ids whose image
spans carry pad values (radixlm/mm_inputs.py) and one MultimodalItem per image, in order.

The pixels come from the model's own HF processor (AutoProcessor, e.g. LlavaProcessor with its
CLIPImageProcessor): the same resizing, normalization and placeholder expansion as transformers.
Runs on the tokenizer threads.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from radixlm.engine.media import MediaConfig, load_image
from radixlm.mm_inputs import MultimodalInputs, MultimodalItem, content_hash, pad_value

logger = logging.getLogger(__name__)


class MultimodalProcessor:
    def __init__(self, model_path: str, vocab_size: int, media: MediaConfig):
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_path)
        tok = self.processor.tokenizer
        self.image_token: str = self.processor.image_token
        self.image_token_id: int = tok.convert_tokens_to_ids(self.image_token)
        self.vocab_size = vocab_size
        self.media = media
        # Idefics3 / SmolVLM take each prompt's images as one list (a batch of one sample).
        self.nested = type(self.processor).__name__ in ("Idefics3Processor", "SmolVLMProcessor")

    def load_image(self, source: str, field: str):
        return load_image(source, field, self.media)

    def load_images(self, sources: list[str], field: str) -> list:
        return [self.load_image(s, f"{field}[{i}]") for i, s in enumerate(sources)]

    def process(self, text: str, images: list, field: str) -> tuple[list[int], Optional[MultimodalInputs]]:
        """(token ids with pad values in each image span, the items); `text` holds one image token
        per image, where it goes."""
        marks = text.count(self.image_token)
        if marks != len(images):
            raise ValueError(f"{field}: {len(images)} image(s) given but the prompt has {marks} {self.image_token!r} "
                             "placeholder(s); put one where each image goes")
        out = self.processor(text=text, images=[images] if self.nested else images, return_tensors="pt")
        ids = out["input_ids"][0].tolist()
        # Units: what the encoder takes one at a time (an image; Idefics3: each tile of its split and the
        # whole image), in the order of the placeholder runs; all-zero units are padding (as in HF).
        pixels = out["pixel_values"]
        units = pixels.reshape(-1, *pixels.shape[-3:])
        masks = out.get("pixel_attention_mask")
        masks = None if masks is None else masks.reshape(-1, *masks.shape[-2:])
        real = [k for k in range(units.shape[0]) if bool((units[k] != 0).any())]
        spans = _image_spans(ids, self.image_token_id, len(real))
        items = []
        for k, (start, length) in zip(real, spans):
            pv = units[k].contiguous()
            extra = {} if masks is None else {"pixel_attention_mask": masks[k].contiguous()}
            h = content_hash(pv.numpy().tobytes() + b"".join(m.numpy().tobytes() for m in extra.values()))
            ids[start:start + length] = [pad_value(h, self.vocab_size)] * length
            items.append(MultimodalItem(hash=h, offset=start, length=length, pixel_values=pv, extra=extra))
        return ids, MultimodalInputs(tuple(items))


def _image_spans(ids: list[int], token_id: int, n_images: int) -> list[tuple[int, int]]:
    """(start, length) of each unit's placeholder run; units placed side by side make one run, split
    evenly (every unit of one request has the same token count: LLaVA's images, Idefics3's tiles)."""
    arr = np.asarray(ids)
    pos = np.flatnonzero(arr == token_id)
    if len(pos) == 0 or len(pos) % n_images:
        raise ValueError(f"the processor wrote {len(pos)} image tokens for {n_images} image(s)")
    per = len(pos) // n_images
    runs, start = [], pos[0]
    for a, b in zip(pos[:-1], pos[1:]):
        if b != a + 1:
            runs.append((int(start), int(a - start + 1)))
            start = b
    runs.append((int(start), int(pos[-1] - start + 1)))
    spans = []
    for s, n in runs:
        if n % per:
            raise ValueError(f"an image placeholder run of {n} tokens does not split into images of {per}")
        spans += [(s + k * per, per) for k in range(n // per)]
    return spans


def request_images(obj, i: int) -> Optional[list[str]]:
    """Item i's image sources from GenerateReqInput.image_data (None: none): a string or list for a
    single prompt; for a batch, one string, list or null per prompt."""
    data = obj.image_data
    if data in (None, [], ""):
        return None
    if not obj.is_single:
        if not isinstance(data, list) or len(data) != obj.batch_size:
            raise ValueError(f"image_data must have one entry (a string, a list or null) per prompt: "
                             f"{obj.batch_size} for this batch")
        data = data[i]
        if data in (None, [], ""):
            return None
    return [data] if isinstance(data, str) else data


def multimodal_prompt(tm, obj, i: int, text: str):
    """(ids, MultimodalInputs) for item i of obj when it has images, else None; tm: the
    TokenizerManager (its processor is built at the first image)."""
    pre = getattr(obj, "_mm_prompt", None)  # the chat route processed its images already (server/chat_images.py)
    if pre is not None and obj.is_single:
        return pre
    images = request_images(obj, i)
    if images is None:
        return None
    field = "image_data" if obj.is_single else f"image_data[{i}]"
    if not isinstance(images, list) or not all(isinstance(s, str) for s in images):
        raise ValueError(f"{field} must be a string or a list of strings")
    if "image" not in tm.scheduler_info.get("modalities", ["text"]):
        raise ValueError(f"{field}: the served model takes text only")
    proc = processor_of(tm)
    return proc.process(text, proc.load_images(images, field), field)


def processor_of(tm) -> MultimodalProcessor:
    """The TokenizerManager's processor, built at its first image (any tokenizer thread may: the
    same one twice is harmless)."""
    proc = getattr(tm, "mm_processor", None)
    if proc is None:
        proc = tm.mm_processor = MultimodalProcessor(tm.scheduler_info["model_path"], tm.vocab_size, tm.config.media)
    return proc
