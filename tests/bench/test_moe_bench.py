"""benchmarks/moe.py: the random OLMoE-shaped GGUF (written at a tiny size) loads as llama.cpp would
read it (olmoe, the experts' 3-D Q8_0 blocks kept, SmolLM2's tokenizer read although transformers
has no olmoe GGUF config), and its step-bytes arithmetic matches the default (OLMoE-1B-7B) shape."""

from __future__ import annotations

from benchmarks import moe as bench
from radixlm.kernels.formats import INTERLEAVED  # experts are kept in the kernels' 8-row layout
from radixlm.model.layers.moe.moe_block import SparseMoeBlock
from radixlm.model.loader import load_model, load_tokenizer

TINY = bench.MoeShape(layers=2, hidden=64, heads=4, intermediate=64, experts=8, top_k=2)


def test_tiny_olmoe_gguf_loads_with_its_tokenizer(tmp_path, default_model_path):
    path = str(tmp_path / "olmoe.gguf")
    bench.write_gguf(path, TINY, "q8_0")
    text = "Mixture of experts: 64 experts, 8 of them per token."
    assert (
        load_tokenizer(path)(text)["input_ids"]
        == load_tokenizer(default_model_path)(text)["input_ids"]
    )
    loaded = load_model(path)
    assert loaded.architecture == "OlmoeForCausalLM" and loaded.hf_config.num_experts_per_tok == 2
    blocks = [m for m in loaded.model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 2 and all(
        b.w13.fmt == INTERLEAVED["q8_0"] and b.w13.num_experts == 8 for b in blocks
    )


def test_olmoe_shape_step_bytes():
    s = bench.MoeShape()
    # ~6.9B parameters, ~1.3B active (OLMoE-1B-7B's model card: 6.9B total, 1.3B active)
    total = (
        s.layers * (4 * s.hidden**2 + s.experts * 3 * s.hidden * s.intermediate)
        + 2 * s.vocab * s.hidden
    )
    assert abs(total - 6.9e9) / 6.9e9 < 0.02
    one = bench.step_bytes(s, 1, 1.0)
    assert (
        one["experts_touched_per_layer"] == 8.0
        and one["bytes_per_step"] == one["active_bytes_per_token"]
    )
    # the card's 1.3B counts the embedding too, of which a step reads one row per token
    assert abs(one["active_bytes_per_token"] + s.vocab * s.hidden - 1.3e9) / 1.3e9 < 0.02
    assert (
        bench.step_bytes(s, 32, 1.0)["experts_touched_per_layer"] > 60
    )  # a batch of 32 reads nearly all 64
