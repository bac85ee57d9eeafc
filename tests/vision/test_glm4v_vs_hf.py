"""GLM-4V with images (Glm4vForConditionalGeneration: GLM-4.1V-Thinking;
Glm46VForConditionalGeneration: GLM-4.6V; Glm4vMoeForConditionalGeneration: GLM-4.5V;
models/glm4v.py) against HF transformers on tiny random float32 checkpoints, through the Engine:
greedy tokens (the near-tie rule) and their logprobs to 1e-4 for text alone, one image, two
images of different sizes (their own grids) and the same image twice (encoded once), with chunked
prefill cutting every image span; the same prompt again is served from the radix cache past its
images with the same answer, the encoder not run again; the cases batched; a second turn hits into
the first turn's answer (its K/V written at index + the images' M-RoPE delta). The logprobs are
what tells GLM-4V's M-RoPE (sectioned, over interleaved pairs in the dense decoder) from another
layout (an interleaved one fails them)."""

import pytest

from radixlm import Engine
from tests.conftest import engine_args
from tests.vision.conftest import load_hf_qwen
from tests.vision.glm4v_checkpoint import ARCHS, GLM46V_MOE, IMG, write_tiny_glm4v
from tests.vision.test_qwen2vl_vs_hf import hf_reference as _hf_reference
from tests.vision.test_qwen2vl_vs_hf import urls
from tests.vision.test_qwen35vl_vs_hf import SP, check_against_hf, generate

N = 16
CASES = [
    ("<|im_start|>user\nwhat is a radix tree?<|im_end|>\n<|im_start|>assistant\n", []),
    (f"<|im_start|>user\n{IMG}what is this?<|im_end|>\n<|im_start|>assistant\n", [(1, (40, 36))]),
    # 40x36: a grid of 4 rows of 5 tokens; 24x60: 8 rows of 3
    (f"user: {IMG} and {IMG} differ how?\nassistant:", [(2, (40, 36)), (3, (24, 60))]),
    # the same image twice in one prompt: one encode, its embedding in both spans
    (f"user: {IMG} then {IMG} again?\nassistant:", [(4, (40, 36)), (4, (40, 36))]),
]
IDS = ["text-only", "one", "two-sizes", "same-twice"]


@pytest.fixture(scope="module", params=list(ARCHS))
def family(request, tmp_path_factory, tokenizer_dir, tiny_glm4v_dir, hf_glm4v):
    """(kind, the HF model and processor, an Engine): chunks of 8 tokens, every image span (20, 24
    tokens) cut."""
    kind = request.param
    if kind == "glm4v":
        path, hf = tiny_glm4v_dir, hf_glm4v
    else:
        path = write_tiny_glm4v(str(tmp_path_factory.mktemp(f"tiny-{kind}")), tokenizer_dir, kind)
        hf = load_hf_qwen(path, ARCHS[kind][1])
    with Engine(path, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        yield kind, hf, e


_REFS: dict = {}


def hf_reference(hf, text, images, n=N):
    """test_qwen2vl_vs_hf.hf_reference, once per model and prompt (the tests ask again)."""
    key = (hf[0], text, tuple(images), n)  # the model itself: no id reused
    if key not in _REFS:
        _REFS[key] = _hf_reference(hf, text, images, n)
    return _REFS[key]


def _encoded(engine) -> int:
    return engine.get_internal_state()["mm_images_encoded"]


@pytest.mark.parametrize("text,images", CASES, ids=IDS)
def test_greedy_and_logprobs_match_hf_and_the_cache_serves_the_images(family, text, images):
    kind, hf, engine = family
    inputs, tokens, logprobs = hf_reference(hf, text, images, N)
    distinct = len(set(images))
    if images:
        assert len({tuple(g) for g in inputs["image_grid_thw"].tolist()}) == distinct
    ids = inputs["input_ids"][0].tolist()
    image = [i for i, t in enumerate(ids) if t == hf[0].config.image_token_id]
    engine.flush_cache()
    before = _encoded(engine)
    out = generate(engine, text, images, return_logprob=True, top_logprobs_num=5)
    check_against_hf(out, tokens, logprobs, f"{kind} first")
    assert out["meta_info"]["cached_tokens"] == 0
    again = generate(engine, text, images, return_logprob=True)
    check_against_hf(again, tokens, logprobs, f"{kind} again")
    assert again["output_ids"] == out["output_ids"]
    assert again["meta_info"]["cached_tokens"] > (image[-1] if image else len(ids) // 2)
    assert _encoded(engine) - before == distinct  # the second request encoded nothing


def test_batch_matches_hf(family):
    kind, hf, engine = family
    refs = [hf_reference(hf, t, imgs, N)[1] for t, imgs in CASES]
    outs = engine.generate(
        [t for t, _ in CASES], SP, image_data=[urls(imgs) or None for _, imgs in CASES]
    )
    assert [o["output_ids"] for o in outs] == refs, kind


def test_second_turn_hits_into_the_first_answer(family):
    kind, hf, engine = family
    engine.flush_cache()
    text, images = CASES[2]
    inputs, tokens, _ = hf_reference(hf, text, images, N)
    assert generate(engine, text, images)["output_ids"] == tokens
    turn2 = text + hf[1].tokenizer.decode(tokens) + "\nuser: and now?\nassistant:"
    inputs2, tokens2, logprobs2 = hf_reference(hf, turn2, images, N)
    out = generate(engine, turn2, images, return_logprob=True)
    assert out["meta_info"]["cached_tokens"] > inputs["input_ids"].shape[1] + 4  # into the answer
    check_against_hf(out, tokens2, logprobs2, f"{kind} turn 2")


def test_glm46v_over_the_moe_decoder_matches_hf(tmp_path_factory, tokenizer_dir):
    """Glm46VForConditionalGeneration whose text and vision configs are GLM-4.5V's
    (glm4v_moe_text, glm4v_moe_vision: GLM-4.6V is a MoE), two images in one prompt."""
    path = write_tiny_glm4v(
        str(tmp_path_factory.mktemp("tiny-glm46v-moe")), tokenizer_dir, "glm46v-moe"
    )
    hf = load_hf_qwen(path, GLM46V_MOE[1])
    text, images = CASES[2]
    _, tokens, logprobs = hf_reference(hf, text, images, N)
    with Engine(path, **engine_args(chunked_prefill_size=8, max_prefill_tokens=8)) as e:
        out = generate(e, text, images, return_logprob=True)
    check_against_hf(out, tokens, logprobs, "glm46v over the MoE decoder")
