"""--enable-torch-compile (SGLang's flag): compiled decode steps give the eager engine's tokens and
logprobs; where compiling does not apply the flag is accepted and says why."""

import random

import pytest
import torch

from radixlm import Engine
from tests.conftest import engine_args
from tests.forked_servers import run_cli

SP = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def _run(model_path, prompts, **opts):
    """(one request alone, then all at once: a decode batch of len(prompts)), with their logprobs;
    and the engine's internal state."""
    with Engine(model_path, **engine_args(log_level="info", **opts)) as e:
        outs = [
            e.generate(
                input_ids=prompts[0], sampling_params=SP, return_logprob=True, top_logprobs_num=3
            )
        ]
        outs += e.generate(
            input_ids=prompts, sampling_params=SP, return_logprob=True, top_logprobs_num=3
        )
        return outs, e.get_internal_state()


def _assert_same_outputs(compiled, eager):
    for c, e in zip(compiled, eager, strict=True):
        assert c["output_ids"] == e["output_ids"]
        got, ref = c["meta_info"]["output_token_logprobs"], e["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in got] == [t for _, t, _ in ref]
        assert [lp for lp, _, _ in got] == pytest.approx([lp for lp, _, _ in ref], abs=1e-5)
        for top_c, top_e in zip(
            c["meta_info"]["output_top_logprobs"],
            e["meta_info"]["output_top_logprobs"],
            strict=True,
        ):
            assert [t for _, t, _ in top_c] == [t for _, t, _ in top_e]
            assert [lp for lp, _, _ in top_c] == pytest.approx([lp for lp, _, _ in top_e], abs=1e-5)


def test_compiled_decode_equals_eager_on_the_float_path(tiny_model_dir, capfd):
    rng = random.Random(0)
    prompts = [
        [rng.randrange(3, 40000) for _ in range(n)] for n in (5, 17, 40)
    ]  # bs 3: padded to 4
    eager, _ = _run(tiny_model_dir, prompts)
    compiled, state = _run(
        tiny_model_dir, prompts, enable_torch_compile=True, torch_compile_max_bs=4
    )
    log = capfd.readouterr().err
    assert (
        "torch.compile: decode batches of 1-4 requests compiled (batch sizes [1, 2, 4], padded up)"
        in log
    )
    info = state["torch_compile"]
    assert info["compiled"] and info["batch_sizes"] == [1, 2, 4]
    # Every decode step but the last of each round (7 of bs 1, 7 of bs 3) ran compiled.
    assert info["decode_steps"] >= 2 * (SP["max_new_tokens"] - 1)
    assert (
        info["graphs"] == 3 and info["recompiles"] == 0
    )  # one graph per size; the guards held while serving
    _assert_same_outputs(compiled, eager)


@pytest.fixture(scope="module")
def tiny_granite_dir(tmp_path_factory, default_model_path):
    """A 2-layer Granite (its multipliers: no fused native op, its layers run in Python) with
    SmolLM2's tokenizer."""
    from transformers import GraniteConfig, GraniteForCausalLM

    from radixlm.model.loader import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-granite")
    tok = load_tokenizer(default_model_path)
    cfg = GraniteConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.25,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.25,
        logits_scaling=2.0,
    )
    torch.manual_seed(0)
    GraniteForCausalLM(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_compiled_decode_equals_eager_on_a_quantized_path(tiny_granite_dir, capfd):
    """q8_0 weights (GGUF's block format, through the native quantized kernels) on a model the fused
    op does not cover: its decode steps compile, with the eager engine's outputs."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 40000) for _ in range(n)] for n in (6, 11)]
    eager, _ = _run(tiny_granite_dir, prompts, quantization="q8_0")
    compiled, state = _run(
        tiny_granite_dir,
        prompts,
        quantization="q8_0",
        enable_torch_compile=True,
        torch_compile_max_bs=2,
    )
    assert (
        "torch.compile: decode batches of 1-2 requests compiled (batch sizes [1, 2]"
        in capfd.readouterr().err
    )
    info = state["torch_compile"]
    assert (
        info["graphs"] == 2
        and info["recompiles"] == 0
        and info["decode_steps"] >= 2 * (SP["max_new_tokens"] - 1)
    )
    _assert_same_outputs(compiled, eager)


def test_fused_quantized_path_is_not_compiled_and_says_why(tiny_model_dir, capfd):
    """q8_0 weights on a Llama run every layer in the native fused op, which leaves torch.compile
    nothing to save (docs/benchmarks.md): the flag is accepted, nothing is compiled, and the log
    and /get_server_info say why."""
    with Engine(
        tiny_model_dir,
        **engine_args(log_level="info", quantization="q8_0", enable_torch_compile=True),
    ) as e:
        out = e.generate(input_ids=[[5, 6, 7, 8], [9, 10, 11]], sampling_params=SP)
        state = e.get_internal_state()
    assert [len(o["output_ids"]) for o in out] == [SP["max_new_tokens"]] * 2
    log = capfd.readouterr().err
    line = (
        "torch.compile: not compiled: the native fused decoder op already runs every layer in one"
        " call"
    )
    assert line in log and "; every forward runs eager" in log
    assert state["torch_compile"]["compiled"] is False
    assert state["torch_compile"]["reason"].startswith(
        "the native fused decoder op already runs every layer"
    )


def test_bad_max_bs_is_refused_at_start_naming_the_flag(tiny_model_dir):
    proc = run_cli(
        [
            "serve",
            "--model-path",
            tiny_model_dir,
            "--enable-torch-compile",
            "--torch-compile-max-bs",
            "0",
        ],
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "radixlm: error: torch_compile_max_bs must be positive, got 0"
    ]
