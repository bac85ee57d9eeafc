"""GLM-4-0414 / GLM-Z1 (Glm4ForCausalLM: sandwich norms, partial RoPE over interleaved pairs, a
fused gate_up_proj; models/glm4.py) end to end against HF transformers in float32: greedy tokens
alone, batched and in prefill chunks smaller than the prompt (near-tie rule), the radix cache exact
(tests/model/cache_checks.py), the same weights as llama.cpp's converter writes them (glm4)
answering alike, its Q8_0 file's top-1 agreeing with HF holding the file's weights, and configs
radixlm cannot run refused by name."""

from __future__ import annotations

import pytest

from tests.model.cache_checks import check_greedy_and_cache, check_greedy_and_evictions
from tests.model.converter_gguf import assert_file_holds, write_gguf
from tests.model.windowed_checkpoints import VOCAB, checkpoint


@pytest.fixture(scope="module")
def glm4(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("glm4"))
    hf = checkpoint(
        "Glm4Config",
        "Glm4ForCausalLM",
        path,
        head_dim=16,
        max_position_embeddings=1024,
        attention_bias=True,  # GLM-4-0414's q/k/v biases
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
    )
    return path, hf


def test_safetensors_greedy_and_cache(glm4):
    path, hf = glm4
    check_greedy_and_cache(path, hf, "glm4")


def test_gguf_greedy_and_evictions(glm4, tmp_path):
    """The converter's float32 file: HF's tokens, also through a small pool."""
    path, hf = glm4
    gguf_path = write_gguf(hf, path, str(tmp_path / "f32.gguf"), "glm4")
    assert_file_holds(hf, gguf_path)  # every weight read back exactly
    check_greedy_and_evictions(gguf_path, hf, "glm4 gguf")


def test_q8_0_gguf_agrees_with_hf_top1(glm4, tmp_path):
    """The native kernels on the file's Q8_0 blocks (the fused ffn_up cut into its shards, q / k
    rows moved whole): top-1 agreement >= 95% with HF holding the file's weights."""
    from tests.model.hybrid_checkpoints import dequantized_as_q8_0
    from tests.model.top1_agreement import top1_agreement

    path, hf = glm4
    q8 = write_gguf(hf, path, str(tmp_path / "q8_0.gguf"), "glm4", qtype="q8_0")
    agree, total = top1_agreement(q8, hf, dequantized_as_q8_0(hf), VOCAB, new_tokens=120)
    print(f"glm4 Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"glm4 Q8_0: top-1 agreement {agree}/{total}"


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(hidden_act="gelu"), "hidden_act"),
        (
            dict(rope_parameters={"rope_type": "default", "mrope_section": [8, 12, 12]}),
            "mrope_section",
        ),
    ],
)
def test_unsupported_configs_are_refused_by_name(change, field):
    import transformers

    from radixlm.model.models.glm4 import Glm4ForCausalLM

    cfg = transformers.Glm4Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=64, **change,
    )  # fmt: skip
    with pytest.raises(ValueError, match=field):
        Glm4ForCausalLM(cfg)
