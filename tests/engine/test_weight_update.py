"""Weight updates through the Python Engine (SGLang's Engine methods, docs/rl.md): an engine on
random checkpoint A updated from disk to checkpoint B gives a fresh engine on B's greedy outputs and
weights, with the radix cache flushed; from safetensors (float32) and from Q8_0 GGUF files
(quantized); at tensor parallelism 2 (every rank loads its shard; a weight read back is the whole
tensor). A checkpoint that does not fit is a ValueError naming the field, and A serves on."""

from __future__ import annotations

import os

import pytest

from radixlm import Engine
from tests.checkpoints import damaged_copy, q8_0_gguf, safetensors_tensor, tiny_like
from tests.conftest import engine_args

PROMPTS = ["The capital of France is", "def fib(n):", "One, two, three,"]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
# q_proj / k_proj / gate_proj are shards of fused layers, o_proj and down_proj split by columns
# under TP.
NAMES = [
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.1.mlp.gate_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.norm.weight",
]


@pytest.fixture(scope="module")
def ckpt_b(tiny_model_dir, tmp_path_factory):
    return tiny_like(tiny_model_dir, str(tmp_path_factory.mktemp("ckpt-b")), seed=1)


@pytest.fixture(scope="module")
def ref_b(ckpt_b):
    """A fresh engine on B: its greedy outputs and weights."""
    return _reference(ckpt_b)


def _outputs(e: Engine) -> list[list[int]]:
    return [o["output_ids"] for o in e.generate(PROMPTS, GREEDY)]


def _reference(path: str, **kw) -> tuple[list, dict]:
    with Engine(path, **engine_args(**kw)) as e:
        return _outputs(e), {n: e.get_weights_by_name(n, 5) for n in NAMES}


@pytest.mark.parametrize("form", ["safetensors", "gguf-q8_0"])
def test_update_from_disk_gives_a_fresh_engine_on_b(form, tiny_model_dir, ckpt_b, ref_b, tmp_path):
    a, b, kw = tiny_model_dir, ckpt_b, {}
    if (
        form == "gguf-q8_0"
    ):  # the GGUF loader, weights kept in their Q8_0 blocks (the native kernels)
        a, b = q8_0_gguf(a, str(tmp_path / "a.gguf")), q8_0_gguf(b, str(tmp_path / "b.gguf"))
        kw = {"tokenizer_path": tiny_model_dir}
    want, want_weights = ref_b if form == "safetensors" else _reference(b, **kw)
    with Engine(a, **engine_args(**kw)) as e:
        before = _outputs(e)
        assert (
            e.generate(PROMPTS[0], GREEDY)["meta_info"]["cached_tokens"] > 0
        )  # the cache holds A's prompt
        ok, message, paused = e.update_weights_from_disk(b)
        assert ok and paused == 0 and "Succeeded" in message
        assert e.generate(PROMPTS[0], GREEDY)["meta_info"]["cached_tokens"] == 0  # flushed
        assert _outputs(e) == want != before
        got = {n: e.get_weights_by_name(n, 5) for n in NAMES}
        assert got == want_weights
        assert e.get_internal_state()["weights"]["model_path"] == b
    if form == "safetensors":  # float32 weights read back exactly as the checkpoint holds them
        for n in NAMES:
            hf = safetensors_tensor(b, "model.embed_tokens.weight" if n == "lm_head.weight" else n)
            assert got[n] == hf[:5].tolist(), n
            assert len(got[n]) == min(5, hf.shape[0])


def test_refused_checkpoints_raise_and_a_serves_on(tiny_model_dir, tmp_path):
    base = tiny_model_dir
    wider = tiny_like(base, str(tmp_path / "wider"), seed=3, hidden_size=128, intermediate_size=256)
    qwen = tiny_like(base, str(tmp_path / "qwen"), seed=4, architecture="Qwen2ForCausalLM")
    damaged = damaged_copy(tiny_like(base, str(tmp_path / "b"), seed=5), str(tmp_path / "damaged"))
    os.mkfifo(tmp_path / "fifo")  # opened, it would block the scheduler until someone writes
    cases = [
        (dict(model_path=str(tmp_path / "missing")), "does not exist"),
        (dict(model_path=str(tmp_path / "fifo")), "neither a directory nor a regular file"),
        (dict(model_path=wider), "hidden_size 128"),
        (dict(model_path=qwen), "Qwen2ForCausalLM"),
        (dict(model_path=damaged), "did not load"),
        (dict(model_path=base, load_format="gguf"), "load_format 'gguf' does not match"),
        (dict(model_path=base, load_format="pt"), "load_format must be one of"),
        (dict(model_path=base, is_async=True), "is_async is not supported"),
        (
            dict(model_path=base, no_such_field=1),
            "unknown field(s) for update_weights_from_disk: no_such_field",
        ),
    ]
    with Engine(base, **engine_args()) as e:
        before = _outputs(e)
        for kw, reason in cases:
            with pytest.raises(
                ValueError, match="model_path|load_format|is_async|no_such_field"
            ) as info:
                e.update_weights_from_disk(**kw)
            assert reason in str(info.value), (kw, str(info.value))
        with pytest.raises(
            ValueError, match="name: the model has no weight 'model.layers.9.mlp.up_proj.weight'"
        ):
            e.get_weights_by_name("model.layers.9.mlp.up_proj.weight")
        with pytest.raises(ValueError, match="truncate_size must be an integer >= 0"):
            e.get_weights_by_name("model.norm.weight", -1)
        with pytest.raises(ValueError, match="mode must be one of abort, retract, in_place"):
            e.pause_generation("stop")
        with pytest.raises(
            ValueError, match="tags must be a list of weights, kv_cache, cuda_graph"
        ):
            e.release_memory_occupation(["gpu"])
        assert _outputs(e) == before  # A's weights serve on, cache and all
        name = "model.layers.1.self_attn.v_proj.weight"
        assert e.get_weights_by_name(name, 3) == safetensors_tensor(base, name)[:3].tolist()
        assert e.get_internal_state()["weights"] == {
            "model_path": base,
            "weight_version": "default",
            "paused": None,
            "released": [],
            "update_pending": False,
            "deferred_requests": 0,
        }


def test_tp2_ranks_load_their_shards_and_read_back_whole_tensors(tiny_model_dir, ckpt_b, ref_b):
    want = ref_b[0]
    with Engine(tiny_model_dir, **engine_args(tp_size=2)) as e:
        assert _outputs(e) != want
        assert e.update_weights_from_disk(ckpt_b, weight_version="step-1")[:2] == (
            True,
            "Succeeded to update model weights. Weight version updated to step-1.",
        )
        assert _outputs(e) == want
        for n in (
            NAMES
        ):  # each gathered from both ranks' shards (q/k: heads; o/down: columns; embed: vocab rows)
            hf = safetensors_tensor(
                ckpt_b, "model.embed_tokens.weight" if n == "lm_head.weight" else n
            )
            assert e.get_weights_by_name(n, hf.shape[0]) == hf.tolist(), n
        e.release_memory_occupation()
        e.resume_memory_occupation()  # every rank loads its shard of B again
        assert _outputs(e) == want
