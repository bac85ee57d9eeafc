"""The in-process Engine: a refusal inside the scheduler process is a StartupRefusalError carrying
its one line (a ValueError, as a refusal in the caller's process is, and a RuntimeError, as any
failed start is); the command line's version is tests/e2e/test_startup_refusals.py."""

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
