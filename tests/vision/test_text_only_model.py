"""A text-only model (the session's plain engine on the tiny Llama, tests/conftest.py) refuses
images with an error naming the field, and goes on serving."""

import pytest

from tests.vision.conftest import data_url


def test_text_model_refuses_image_data(tiny_engine):
    e = tiny_engine
    with pytest.raises(ValueError, match="image_data: the served model takes text only"):
        e.generate("<image> hi", {"max_new_tokens": 2}, image_data=data_url(1))
    with pytest.raises(ValueError, match="image_data needs text"):
        e.generate(
            sampling_params={"max_new_tokens": 2}, input_ids=[1, 2, 3], image_data=data_url(1)
        )
    assert (
        e.generate("hi", {"max_new_tokens": 2, "ignore_eos": True})["meta_info"][
            "completion_tokens"
        ]
        == 2
    )
