"""A text-only model refuses images with an error naming the field, and goes on serving."""

import pytest

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.conftest import data_url


def test_text_model_refuses_image_data(tiny_model_dir):
    with Engine(tiny_model_dir, **engine_args()) as e:
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
