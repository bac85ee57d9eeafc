"""The in-process Engine: a refusal inside the scheduler process is a StartupRefusalError carrying
its one line (a ValueError, as a refusal in the caller's process is, and a RuntimeError, as any
failed start is); the command line's version is tests/e2e/test_startup_refusals.py."""

import json
import re
import shutil

import pytest

from radixlm import Engine
from radixlm.errors import StartupRefusalError
from tests.conftest import engine_args


def test_a_scheduler_refusal_is_a_startup_refusal_error(tiny_model_dir):
    with pytest.raises(StartupRefusalError) as refused:
        Engine(tiny_model_dir, **engine_args(quantization="gguf"))
    assert str(refused.value) == (
        "quantization 'gguf' keeps a GGUF file's own formats; the model is not a GGUF"
    )
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, RuntimeError)


def test_an_unsupported_architecture_is_refused_naming_the_closest(tiny_model_dir, tmp_path):
    """A checkpoint of an architecture radixlm does not serve (GLM-OCR's name on the tiny Llama):
    one line naming it and the closest one radixlm serves, not the whole list."""
    path = unsupported_checkpoint(tiny_model_dir, tmp_path)
    with pytest.raises(ValueError) as refused:
        Engine(path, **engine_args())
    assert re.fullmatch(UNSUPPORTED, str(refused.value)), str(refused.value)


# (tests/e2e/test_startup_refusals.py reads these too)
UNSUPPORTED = (
    r"unsupported model architecture GlmOcrForConditionalGeneration; the closest radixlm serves:"
    r" Glm4\w+ \(full list: `radixlm models` or docs/models\.md#coverage\)"
)


def unsupported_checkpoint(tiny_model_dir, tmp_path) -> str:
    path = shutil.copytree(tiny_model_dir, tmp_path / "glmocr")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GlmOcrForConditionalGeneration"]
    (path / "config.json").write_text(json.dumps(config))
    return str(path)
