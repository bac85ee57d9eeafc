import base64

import pytest
import torch

from tests.hf_float64 import from_pretrained_float64
from tests.vision.checkpoints import png_bytes, write_tiny_llava, write_tiny_qwen2vl
from tests.vision.qwen35vl_checkpoint import write_tiny_qwen35vl


@pytest.fixture(scope="session")
def tiny_llava_dir(tmp_path_factory, default_model_path):
    from radixlm.model.loader import load_tokenizer

    tok_dir = tmp_path_factory.mktemp("smollm2-tokenizer")
    load_tokenizer(default_model_path).save_pretrained(tok_dir)
    return write_tiny_llava(str(tmp_path_factory.mktemp("tiny-llava")), str(tok_dir))


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, default_model_path) -> str:
    """SmolLM2's tokenizer as a HF directory (the tiny checkpoints add their image tokens to it)."""
    from radixlm.model.loader import load_tokenizer

    path = tmp_path_factory.mktemp("smollm2-tok")
    load_tokenizer(default_model_path).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_qwen2vl_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny_qwen2vl(str(tmp_path_factory.mktemp("tiny-qwen2vl")), tokenizer_dir)


def load_hf_qwen(path: str, cls_name: str, float64: bool = False):
    """transformers' model and its processor's own code (Qwen2VLProcessor, Qwen3VLProcessor) without
    its video processor, as the server builds it. float64: the exact reference
    (tests/hf_float64.py)."""
    import transformers

    from radixlm.engine.hf_processors import load_hf_processor

    cls = getattr(transformers, cls_name)
    if float64:
        model = from_pretrained_float64(cls, path)
    else:
        model = cls.from_pretrained(path, dtype=torch.float32).eval()
    return model, load_hf_processor(path)


@pytest.fixture(scope="session")
def hf_qwen2vl(tiny_qwen2vl_dir):
    return load_hf_qwen(tiny_qwen2vl_dir, "Qwen2VLForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_qwen35vl_dir(tmp_path_factory, tokenizer_dir):
    return write_tiny_qwen35vl(str(tmp_path_factory.mktemp("tiny-qwen35vl")), tokenizer_dir)


@pytest.fixture(scope="session")
def hf_qwen35vl(tiny_qwen35vl_dir):
    return load_hf_qwen(tiny_qwen35vl_dir, "Qwen3_5ForConditionalGeneration", float64=True)


@pytest.fixture(scope="session")
def hf_llava(tiny_llava_dir):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(
        tiny_llava_dir, dtype=torch.float32
    ).eval()
    return model, AutoProcessor.from_pretrained(tiny_llava_dir)


def data_url(seed: int, size=(40, 36)) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed, size)).decode()


@pytest.fixture(scope="session")
def tiny_qwen3vl_dir(tmp_path_factory, tokenizer_dir):
    from tests.vision.qwen3vl_checkpoint import write_tiny_qwen3vl

    return write_tiny_qwen3vl(str(tmp_path_factory.mktemp("tiny-qwen3vl")), tokenizer_dir)


@pytest.fixture(scope="session")
def hf_qwen3vl(tiny_qwen3vl_dir):
    return load_hf_qwen(tiny_qwen3vl_dir, "Qwen3VLForConditionalGeneration")


@pytest.fixture(scope="session")
def tiny_glm4v_dir(tmp_path_factory, tokenizer_dir):
    from tests.vision.glm4v_checkpoint import write_tiny_glm4v

    return write_tiny_glm4v(str(tmp_path_factory.mktemp("tiny-glm4v")), tokenizer_dir)


@pytest.fixture(scope="session")
def hf_glm4v(tiny_glm4v_dir):
    return load_hf_qwen(tiny_glm4v_dir, "Glm4vForConditionalGeneration")
