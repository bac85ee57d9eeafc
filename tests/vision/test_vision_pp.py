"""Models with images in pipeline stages (--pp-size 2): the first stage embeds the images (the
vision tower and the projector), the later ones take the stream. LLaVA, Qwen2-VL (M-RoPE
positions on every stage), Qwen3.5-VL (a hybrid decoder: its attention KV and recurrent states
split between the stages) and Qwen3-VL (its DeepStack layers on the first stage, which hands the
stream on with the features added) answer HF's greedy tokens, one image and two, in prefill
chunks that cut the image spans."""

from __future__ import annotations

import pytest

from radixlm import Engine
from tests.conftest import engine_args
from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.vision.conftest import data_url
from tests.vision.test_llava_vs_hf import CASES as LLAVA_CASES
from tests.vision.test_llava_vs_hf import hf_reference as llava_reference
from tests.vision.test_qwen2vl_vs_hf import CASES as QWEN_CASES
from tests.vision.test_qwen2vl_vs_hf import hf_reference as qwen_reference
from tests.vision.test_qwen2vl_vs_hf import urls

N = 12
SP = {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}
PP2 = dict(chunked_prefill_size=8, max_prefill_tokens=8, pp_size=2)


def test_llava_pp2_matches_hf(tiny_llava_dir, hf_llava):
    with Engine(tiny_llava_dir, **engine_args(**PP2)) as engine:
        for text, seeds in LLAVA_CASES[:2]:
            tokens, logprobs = llava_reference(hf_llava, text, seeds)
            out = engine.generate(text, SP, image_data=[data_url(s) for s in seeds])
            assert_greedy_equal(out["output_ids"], (None, tokens[:N], logprobs), f"llava {seeds}")


@pytest.mark.parametrize("model", ["qwen2vl", "qwen35vl", "qwen3vl"])
def test_qwen_vl_pp2_matches_hf(model, request):
    path = request.getfixturevalue(f"tiny_{model}_dir")
    hf = request.getfixturevalue(f"hf_{model}")
    with Engine(path, **engine_args(**PP2)) as engine:
        for text, images in QWEN_CASES[:2]:
            _, tokens, logprobs = qwen_reference(hf, text, images, N)
            out = engine.generate(text, SP, image_data=urls(images))
            assert_greedy_equal(out["output_ids"], (None, tokens, logprobs), f"{model} {images}")
