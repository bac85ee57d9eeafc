"""A multimodal model's prompt: text with image placeholders plus images -> token ids whose image
spans carry pad values (radixlm/mm_inputs.py) and one MultimodalItem per image, in order.

The pixels come from the model's own HF processor (AutoProcessor, e.g. LlavaProcessor with its
CLIPImageProcessor; Qwen2-VL's without its video part): the same resizing, normalization and
placeholder expansion as transformers. Runs on the tokenizer threads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixlm.engine.hf_processors import load_hf_processor
from radixlm.engine.media import MediaConfig, load_image
from radixlm.mm_inputs import MultimodalInputs, MultimodalItem, content_hash, pad_value

logger = logging.getLogger(__name__)


@dataclass
class _Unit:
    """What the encoder takes at once (an image; an Idefics3 tile) and how many tokens it gives."""

    pixel_values: Any
    extra: dict
    length: int | None = None  # None: the placeholder runs split evenly between the units
    grid: tuple[int, int, int] | None = None  # the decoder's token grid (M-RoPE)


class MultimodalProcessor:
    def __init__(
        self, model_path: str, vocab_size: int, media: MediaConfig, bidirectional: bool = False
    ):
        self.processor = load_hf_processor(model_path)
        tok = self.processor.tokenizer
        self.image_token: str = self.processor.image_token  # what the prompt holds per image
        self.image_token_id: int = tok.convert_tokens_to_ids(self.image_token)
        self.span_token_ids = _span_token_ids(self.processor, self.image_token_id)
        # Pixtral (Mistral 3): each image its own size, laid out as rows with break tokens.
        self.pixtral = hasattr(self.processor, "image_break_token_id")
        self.bidirectional = bidirectional  # the model's (ModelTraits.bidirectional_images)
        self.vocab_size = vocab_size
        self.media = media
        # Idefics3 / SmolVLM take each prompt's images as one list (a batch of one sample).
        self.nested = type(self.processor).__name__ in (
            "Idefics3Processor",
            "SmolVLMProcessor",
        ) or getattr(self.processor, "nested_images", False)

    def load_image(self, source: str, field: str):
        return load_image(source, field, self.media)

    def load_images(self, sources: list[str], field: str) -> list:
        return [self.load_image(s, f"{field}[{i}]") for i, s in enumerate(sources)]

    def process(
        self, text: str, images: list, field: str
    ) -> tuple[list[int], MultimodalInputs | None]:
        """(token ids with pad values in each image span, the items); `text` holds one image token
        per image, where it goes."""
        marks = text.count(self.image_token)
        if marks != len(images):
            raise ValueError(
                f"{field}: {len(images)} image(s) given but the prompt has {marks}"
                f" {self.image_token!r} placeholder(s); put one where each image goes"
            )
        try:
            out = self.processor(
                text=text, images=[images] if self.nested else images, return_tensors="pt"
            )
        except ValueError as e:  # e.g. Qwen2-VL's resize: an aspect ratio past 200
            raise ValueError(
                f"{field}: the model's image processor refused the image(s): {e}"
            ) from None
        ids = out["input_ids"][0].tolist()
        if "image_grid_thw" in out:
            units = self._grid_units(out)
        elif self.pixtral:
            units = self._sized_units(out)
        elif "batch_num_images" in out:
            units = self._anyres_units(out)
        elif "spatial_shapes" in out:
            units = self._naflex_units(out)
        else:
            units = _padded_units(out)
        spans = _image_spans(ids, self.span_token_ids, [u.length for u in units])
        items = []
        for u, (start, length) in zip(units, spans):
            if self.pixtral:  # the layout's own ids: the encoder embeds the breaks between rows
                import torch

                u.extra["span_ids"] = torch.tensor(ids[start : start + length])
            h = content_hash(
                u.pixel_values.numpy().tobytes()
                + b"".join(t.numpy().tobytes() for t in u.extra.values())
            )
            ids[start : start + length] = [pad_value(h, self.vocab_size)] * length
            items.append(
                MultimodalItem(
                    hash=h,
                    offset=start,
                    length=length,
                    pixel_values=u.pixel_values,
                    extra=u.extra,
                    grid=u.grid,
                )
            )
        return ids, MultimodalInputs(tuple(items), bidirectional=self.bidirectional)

    def _grid_units(self, out) -> list[_Unit]:
        """Qwen2-VL: the images' patches packed in one [patches, dim] tensor, image_grid_thw giving
        each image's (t, h, w) in patches; merge_size^2 patches make one token."""
        m = self.processor.image_processor.merge_size
        units, start = [], 0
        for grid in out["image_grid_thw"]:
            t, h, w = (int(x) for x in grid)
            units.append(
                _Unit(
                    out["pixel_values"][start : start + t * h * w].contiguous(),
                    {"image_grid_thw": grid.clone()},
                    t * h * w // (m * m),
                    (t, h // m, w // m),
                )
            )
            start += t * h * w
        return units

    def _sized_units(self, out) -> list[_Unit]:
        """Pixtral: pixel values padded to the largest image, image_sizes giving each one's (h, w):
        each image cropped to its own size; rows of w / k [IMG] tokens plus a break, h / k rows
        (k = patch_size * spatial_merge_size)."""
        import torch

        k = self.processor.patch_size * self.processor.spatial_merge_size
        units = []
        for px, size in zip(out["pixel_values"], out["image_sizes"]):
            h, w = (int(x) for x in size)
            units.append(
                _Unit(
                    px[:, :h, :w].contiguous(),
                    {"image_sizes": torch.tensor([h, w])},
                    (h // k) * (w // k + 1),
                )
            )
        return units

    def _anyres_units(self, out) -> list[_Unit]:
        """LLaVA-OneVision: one unit per image, its patches (the whole image, then its anyres
        grid's; an image among several: the whole image alone) and its size; its token count is
        the one the processor's own expansion writes (replace_image_token)."""
        sizes, px = out["image_sizes"], out["pixel_values"]
        whole = {"batch_num_images": out["batch_num_images"].tolist(), "image_sizes": sizes}
        whole["pixel_values"] = px
        single = whole["batch_num_images"] == [1]
        units = []
        for i in range(len(sizes)):
            n = len(self.processor.replace_image_token(whole, i)) // len(self.image_token)
            units.append(
                _Unit(
                    (px[i] if single else px[i, :1]).contiguous(),
                    {"image_sizes": sizes[i].clone()},
                    n,
                )
            )
        return units

    def _naflex_units(self, out) -> list[_Unit]:
        """LFM2-VL (SigLIP2 NaFlex): one unit per tile and thumbnail, its patch rows without the
        padding and its spatial shape (rows, columns of patches); downsample_factor^2 patches
        make one token."""
        import torch

        f = self.processor.image_processor.downsample_factor
        units = []
        for px, shape in zip(out["pixel_values"], out["spatial_shapes"]):
            h, w = (int(x) for x in shape)
            units.append(
                _Unit(
                    px[: h * w].contiguous(),
                    {"spatial_shapes": torch.tensor([h, w])},
                    (h // f) * (w // f),
                )
            )
        return units


def _span_token_ids(processor, image_token_id: int) -> list[int]:
    """The ids an image's span is made of in the processed prompt: the prompt's image token, except
    for Gemma 3 (its <start_of_image> expands around a run of <image_soft_token>: the span is that
    run) and Pixtral (rows of [IMG], each closed by [IMG_BREAK], the last by [IMG_END])."""
    tok = processor.tokenizer
    if hasattr(processor, "full_image_sequence"):
        return [tok.convert_tokens_to_ids(tok.image_token)]
    if hasattr(processor, "image_break_token_id"):
        return list(processor.image_token_ids)
    return [image_token_id]


def _padded_units(out) -> list[_Unit]:
    """LLaVA, Idefics3: pixel values [..., C, H, W], one unit each (Idefics3: each tile of its split
    and the whole image), in the order of the placeholder runs; all-zero units are padding (as in
    HF).
    """
    pixels = out["pixel_values"]
    units = pixels.reshape(-1, *pixels.shape[-3:])
    masks = out.get("pixel_attention_mask")
    masks = None if masks is None else masks.reshape(-1, *masks.shape[-2:])
    return [
        _Unit(
            units[k].contiguous(),
            {} if masks is None else {"pixel_attention_mask": masks[k].contiguous()},
        )
        for k in range(units.shape[0])
        if bool((units[k] != 0).any())
    ]


def _image_spans(
    ids: list[int], token_ids: list[int], lengths: list[int | None]
) -> list[tuple[int, int]]:
    """(start, length) of each unit's placeholder run. Units placed side by side make one run, cut
    by the units' lengths where known, else evenly (every unit of a request then has the same count:
    LLaVA's images, Idefics3's tiles)."""
    arr = np.asarray(ids)
    pos = np.flatnonzero(np.isin(arr, token_ids))
    n_units = len(lengths)
    if (
        len(pos) == 0
        or (None in lengths and len(pos) % n_units)
        or (None not in lengths and len(pos) != sum(lengths))
    ):
        raise ValueError(f"the processor wrote {len(pos)} image tokens for {n_units} image(s)")
    runs, start = [], pos[0]
    for a, b in zip(pos[:-1], pos[1:]):
        if b != a + 1:
            runs.append((int(start), int(a - start + 1)))
            start = b
    runs.append((int(start), int(pos[-1] - start + 1)))
    per = len(pos) // n_units
    sizes = iter(per if n is None else n for n in lengths)
    spans = []
    for s, n in runs:
        while n > 0:
            k = next(sizes)
            if k > n:
                raise ValueError(
                    f"an image placeholder run of {n} tokens does not split into its images"
                )
            spans.append((s, k))
            s, n = s + k, n - k
    return spans


def request_images(obj, i: int) -> list[str] | None:
    """Item i's image sources from GenerateReqInput.image_data (None: none): a string or list for a
    single prompt; for a batch, one string, list or null per prompt."""
    data = obj.image_data
    if data in (None, [], ""):
        return None
    if not obj.is_single:
        if not isinstance(data, list) or len(data) != obj.batch_size:
            raise ValueError(
                "image_data must have one entry (a string, a list or null) per prompt: "
                f"{obj.batch_size} for this batch"
            )
        data = data[i]
        if data in (None, [], ""):
            return None
    return [data] if isinstance(data, str) else data


def multimodal_prompt(tm, obj, i: int, text: str):
    """(ids, MultimodalInputs) for item i of obj when it has images, else None; tm: the
    TokenizerManager (its processor is built at the first image)."""
    pre = getattr(
        obj, "_mm_prompt", None
    )  # the chat route processed its images already (server/chat_images.py)
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
        info = tm.scheduler_info
        proc = tm.mm_processor = MultimodalProcessor(
            info["model_path"],
            tm.vocab_size,
            tm.config.media,
            bidirectional=info.get("bidirectional_images", False),
        )
    return proc
