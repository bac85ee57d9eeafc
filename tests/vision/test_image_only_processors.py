"""The processors radixlm builds for images only (their video processors, and LFM2-VL's image
processor, need torchvision) keep what a checkpoint saved: the chat template (the chat route
renders image parts with it) and the family's own settings; GLM-4V's image processor is
transformers' PIL one."""

import pytest

from tests.vision.checkpoints import write_tiny_idefics3
from tests.vision.glm4v_checkpoint import write_tiny_glm4v
from tests.vision.internvl_checkpoint import CHAT_TEMPLATE, write_tiny_internvl
from tests.vision.kimi_k25_checkpoint import write_tiny_kimi_k25
from tests.vision.lfm2vl_checkpoint import write_tiny_lfm2vl
from tests.vision.onevision_checkpoint import write_tiny_onevision


def _smolvlm(path, tok):
    from radixlm.engine.hf_processors import load_hf_processor, smolvlm_image_only

    write_tiny_idefics3(path, tok, "SmolVLM")
    proc = load_hf_processor(path)
    smolvlm_image_only()(
        image_processor=proc.image_processor,
        tokenizer=proc.tokenizer,
        image_seq_len=4,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "write,settings",
    [
        (write_tiny_internvl, {"image_seq_length": 4}),
        (write_tiny_onevision, {"num_image_tokens": 16, "vision_aspect_ratio": "anyres_max_2"}),
        (_smolvlm, {"image_seq_len": 4}),
        (write_tiny_kimi_k25, {"image_token": "<|media_pad|>"}),
        (write_tiny_glm4v, {"image_token": "<|image|>"}),
        (write_tiny_lfm2vl, {"image_token": "<image>"}),
    ],
    ids=["internvl", "onevision", "smolvlm", "kimi_k25", "glm4v", "lfm2vl"],
)
def test_saved_chat_template_and_settings_are_kept(tmp_path, tokenizer_dir, write, settings):
    from radixlm.engine.hf_processors import load_hf_processor

    proc = load_hf_processor(write(str(tmp_path), tokenizer_dir))
    assert proc.chat_template is not None and "<|im_start|>" in proc.chat_template
    assert getattr(proc, "video_processor", None) is None
    for key, value in settings.items():
        assert getattr(proc, key) == value, key


def test_glm4v_processors_take_the_pil_image_processor(tmp_path, tokenizer_dir):
    """The released checkpoints name the torchvision image processor (Glm4vImageProcessor), which
    cannot run without torchvision: the PIL one, from the same saved settings."""
    import json

    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    from radixlm.engine.hf_processors import load_hf_processor

    path = write_tiny_glm4v(str(tmp_path), tokenizer_dir)
    with open(f"{path}/preprocessor_config.json") as f:
        saved = json.load(f)
    saved["image_processor_type"] = "Glm4vImageProcessor"
    with open(f"{path}/preprocessor_config.json", "w") as f:
        json.dump(saved, f)
    proc = load_hf_processor(path)
    assert type(proc).__name__ == "_ImageOnlyGlm4vProcessor"
    assert isinstance(proc.image_processor, Glm4vImageProcessorPil)
    assert proc.image_processor.patch_size == 4 and proc.image_processor.merge_size == 2
    assert proc.image_processor.size["longest_edge"] == 2 * 64 * 64
