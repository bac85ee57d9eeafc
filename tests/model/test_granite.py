"""Granite dense (GraniteForCausalLM) and Granite MoE (GraniteMoeForCausalLM), the muP
multipliers of both (models/granite.py) end to end against HF transformers in float32: greedy
tokens alone, batched and in prefill chunks smaller than the prompt (near-tie rule), the radix cache
exact (tests/model/cache_checks.py), the same weights as llama.cpp's converter writes them (granite
/ granitemoe, q / k permuted) answering alike, its Q8_0 and Q4_K_M-like files' top-1 agreeing
with HF holding each file's weights, and configs radixlm cannot run refused by name."""

from __future__ import annotations

import pytest
import torch

from tests.model.cache_checks import check_greedy_and_cache, check_greedy_and_evictions
from tests.model.converter_gguf import file_weights, write_gguf
from tests.model.windowed_checkpoints import VOCAB, checkpoint

MULTIPLIERS = dict(  # none of them 1, the attention scale not head_dim ** -0.5 (0.25)
    embedding_multiplier=12.0,
    attention_multiplier=0.15,
    residual_multiplier=0.22,
    logits_scaling=2.0,
)
FAMILIES = {
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "granitemoe": (
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2),
    ),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    arch = request.param
    config_cls, architecture, extra = FAMILIES[arch]
    path = str(tmp_path_factory.mktemp(arch))
    hf = checkpoint(
        config_cls,
        architecture,
        path,
        max_position_embeddings=1024,
        hidden_size=256,  # rows of whole 256-value blocks: the Q4_K_M file's Q4_K
        intermediate_size=256,
        attention_bias=arch == "granite",  # Granite 3.x has none; the switch is read
        **MULTIPLIERS,
        **extra,
    )
    return arch, path, hf


def test_safetensors_greedy_and_cache(family):
    arch, path, hf = family
    check_greedy_and_cache(path, hf, arch)


def test_gguf_greedy_and_evictions(family, tmp_path):
    """The converter's float32 file: HF's tokens, also through a small pool."""
    arch, path, hf = family
    gguf_path = write_gguf(hf, path, str(tmp_path / "f32.gguf"), arch)
    held = _holding(hf, gguf_path).state_dict()  # every weight read back exactly
    for name, t in hf.state_dict().items():
        assert torch.equal(held[name], t), name
    check_greedy_and_evictions(gguf_path, hf, f"{arch} gguf")


def test_q8_0_gguf_agrees_with_hf_top1(family, tmp_path):
    """The native kernels on the file's Q8_0 blocks: top-1 agreement >= 95% with HF holding the
    file's weights (the router kept float32, as the converter keeps it)."""
    from tests.model.hybrid_checkpoints import dequantized_as_q8_0
    from tests.model.top1_agreement import top1_agreement

    arch, path, hf = family
    q8 = write_gguf(hf, path, str(tmp_path / "q8_0.gguf"), arch, qtype="q8_0")
    held = dequantized_as_q8_0(hf, kept_float=("router.weight",))
    agree, total = top1_agreement(q8, hf, held, VOCAB, new_tokens=120)
    print(f"{arch} Q8_0 top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{arch} Q8_0: top-1 agreement {agree}/{total}"


def test_q4_k_m_gguf_agrees_with_hf_top1(family, tmp_path):
    """A Q4_K_M-like file (Q4_K, Q8_0 where llama.cpp gives more bits; the experts' stacks too) on
    the native kernels: top-1 agreement >= 95% with HF holding the file's weights."""
    from tests.model.top1_agreement import top1_agreement

    arch, path, hf = family
    q4 = write_gguf(hf, path, str(tmp_path / "q4_k_m.gguf"), arch, qtype="q4_k_m")
    from gguf import GGUFReader

    assert {"Q4_K", "Q8_0"} <= {t.tensor_type.name for t in GGUFReader(q4).tensors}
    agree, total = top1_agreement(q4, hf, _holding(hf, q4), VOCAB, new_tokens=120)
    print(f"{arch} Q4_K_M top-1 agreement {agree}/{total}")
    assert agree / total >= 0.95, f"{arch} Q4_K_M: top-1 agreement {agree}/{total}"


def _holding(hf, gguf_path: str):
    """A copy of hf with the file's weights (dequantized by radixlm's loader, under HF's names:
    the experts' gate and up stacked back into block_sparse_moe.experts.gate_up_proj)."""
    import copy

    weights = file_weights(gguf_path)
    for name in [n for n in weights if n.endswith(".mlp.gate.weight")]:
        base = name.removesuffix("mlp.gate.weight") + "block_sparse_moe."
        experts = name.removesuffix("gate.weight") + "experts."
        weights[base + "router.weight"] = weights.pop(name)
        gate, up = (
            weights.pop(experts + "gate_proj.weight"),
            weights.pop(experts + "up_proj.weight"),
        )
        weights[base + "experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        weights[base + "experts.down_proj"] = weights.pop(experts + "down_proj.weight")
    held = copy.deepcopy(hf)
    assert set(weights) == set(held.state_dict()), set(weights) ^ set(held.state_dict())
    held.load_state_dict(weights)
    return held.eval()


@pytest.mark.parametrize(
    "architecture, change, field",
    [
        ("GraniteForCausalLM", dict(hidden_act="gelu"), "hidden_act"),
        ("GraniteMoeForCausalLM", dict(hidden_act="relu"), "hidden_act"),
        ("GraniteMoeForCausalLM", dict(num_local_experts=0), "num_local_experts"),
    ],
)
def test_unsupported_configs_are_refused_by_name(architecture, change, field):
    import transformers

    from radixlm.model.registry import MODEL_REGISTRY

    config_cls = "GraniteConfig" if architecture == "GraniteForCausalLM" else "GraniteMoeConfig"
    cfg = getattr(transformers, config_cls)(**{**SMALL, **change})
    cfg.architectures = [architecture]
    with pytest.raises(ValueError, match=field):
        MODEL_REGISTRY.get(architecture)(cfg)


SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=64,
)
