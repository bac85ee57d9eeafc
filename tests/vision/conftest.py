import base64

import pytest
import torch

from tests.vision.checkpoints import png_bytes, write_tiny_llava


@pytest.fixture(scope="session")
def tiny_llava_dir(tmp_path_factory, default_model_path):
    from radixlm.model.loader import load_tokenizer

    tok_dir = tmp_path_factory.mktemp("smollm2-tokenizer")
    load_tokenizer(default_model_path).save_pretrained(tok_dir)
    return write_tiny_llava(str(tmp_path_factory.mktemp("tiny-llava")), str(tok_dir))


@pytest.fixture(scope="session")
def hf_llava(tiny_llava_dir):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(tiny_llava_dir, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(tiny_llava_dir)


def data_url(seed: int, size=(40, 36)) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed, size)).decode()
