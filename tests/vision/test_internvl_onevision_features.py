"""InternVL's and LLaVA-OneVision's image features (radixlm's encode_images on the items its
processor makes) equal HF's get_image_features for each vision_feature_layer setting HF runs, and
the settings HF cannot lay out are refused at load, naming the field."""

import io

import pytest
import torch

from tests.vision.checkpoints import png_bytes
from tests.vision.internvl_checkpoint import write_tiny_internvl
from tests.vision.onevision_checkpoint import write_tiny_onevision


def _pair(path, hf_cls, ours_cls, **fields):
    """HF's model and radixlm's of a checkpoint's config with `fields` changed, the vision weights
    (tower, projector, image_newline) copied over."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(path)
    for k, v in fields.items():
        setattr(cfg, k, v)
    hf = getattr(transformers, hf_cls)(cfg).eval()
    ours = ours_cls(cfg)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    res = ours.load_state_dict(
        {k: v for k, v in state.items() if not k.startswith(("language_model", "lm_head"))},
        strict=False,
    )
    assert not res.unexpected_keys
    assert all(k.startswith("language_model.") for k in res.missing_keys)
    return hf, ours


def _items(path, sizes, nested):
    from PIL import Image

    from radixlm.engine.media import MediaConfig
    from radixlm.engine.mm_processor import MultimodalProcessor

    mp = MultimodalProcessor(path, 10**6, MediaConfig())
    imgs = [Image.open(io.BytesIO(png_bytes(i, s))).convert("RGB") for i, s in enumerate(sizes)]
    text = mp.image_token * len(imgs)
    ids, mm = mp.process(text, imgs, "image_data")
    out = mp.processor(text=text, images=[imgs] if nested else imgs, return_tensors="pt")
    return out, list(mm.items)


@pytest.fixture(scope="module")
def internvl_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny_internvl(str(tmp_path_factory.mktemp("ivl")), tokenizer_dir)


@pytest.fixture(scope="module")
def onevision_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny_onevision(str(tmp_path_factory.mktemp("ov")), tokenizer_dir)


@pytest.mark.parametrize("layer", [-1, -2])
def test_internvl_features_match_hf(internvl_dir, layer):
    from radixlm.model.models.internvl import InternVLForConditionalGeneration as Ours

    hf, ours = _pair(
        internvl_dir, "InternVLForConditionalGeneration", Ours, vision_feature_layer=layer
    )
    out, items = _items(internvl_dir, [(64, 64), (30, 90)], nested=False)
    with torch.no_grad():
        ref = hf.model.get_image_features(pixel_values=out["pixel_values"]).pooler_output
        got = torch.stack(ours.encode_images(items))
    assert got.shape == ref.shape and len(items) == 5 + 4  # 2x2 + thumbnail; 1x3 + thumbnail
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layer", [-1, -2, [-2, -1]], ids=["last", "second-last", "two"])
@pytest.mark.parametrize("sizes", [[(40, 36)], [(30, 90)], [(40, 36), (70, 40)]])
def test_onevision_features_match_hf(onevision_dir, layer, sizes):
    from radixlm.model.models.llava_onevision import (
        LlavaOnevisionForConditionalGeneration as Ours,
    )

    hf, ours = _pair(
        onevision_dir, "LlavaOnevisionForConditionalGeneration", Ours, vision_feature_layer=layer
    )
    out, items = _items(onevision_dir, sizes, nested=True)
    with torch.no_grad():
        ref = hf.model.get_image_features(
            out["pixel_values"], out["image_sizes"], batch_num_images=out["batch_num_images"]
        ).pooler_output
        got = ours.encode_images(items)
    assert [g.shape for g in got] == [r.shape for r in ref]
    assert [it.length for it in items] == [r.shape[0] for r in ref]
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "family,fields,why",
    [
        ("internvl", {"vision_feature_select_strategy": "full"}, "InternVL drops the CLS token"),
        ("onevision", {"vision_feature_select_strategy": "default"}, "takes 'full'"),
        ("onevision", {"vision_aspect_ratio": "anyres"}, "'anyres_max_N'"),
    ],
)
def test_settings_hf_cannot_lay_out_are_refused(internvl_dir, onevision_dir, family, fields, why):
    import transformers

    from radixlm.model.models.internvl import InternVLForConditionalGeneration
    from radixlm.model.models.llava_onevision import LlavaOnevisionForConditionalGeneration

    path = internvl_dir if family == "internvl" else onevision_dir
    cls = (
        InternVLForConditionalGeneration
        if family == "internvl"
        else LlavaOnevisionForConditionalGeneration
    )
    cfg = transformers.AutoConfig.from_pretrained(path)
    for k, v in fields.items():
        setattr(cfg, k, v)
    with pytest.raises(ValueError, match=f"{next(iter(fields))}.*{why}"):
        cls(cfg)
