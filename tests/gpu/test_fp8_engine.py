"""FP8 weights on a GPU (--quantization fp8): the engine in bfloat16 with its linear layers in FP8
(the Triton W8A16 GEMM, tuned on first use, captured in the decode CUDA graphs) against HF
transformers in float32 on the CPU with the same dequantized FP8 weights, greedy, under the
bfloat16 near-tie rule (test_cuda_engine.py's): what is left is bfloat16's error."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.test_default_model_greedy import assert_greedy_equal
from tests.gpu.conftest import CUDA, NEW_TOKENS, SP
from tests.gpu.test_cuda_engine import BF16_NEAR_TIE, engine

pytestmark = CUDA


@pytest.fixture(scope="module")
def fp8_refs(gpu_model):
    """HF's greedy references with every linear layer but the (tied) LM head replaced by its FP8
    weight dequantized: quantized from the bfloat16 values the engine loads, as the engine does."""
    from transformers import LlamaForCausalLM

    from radixlm.model.layers.fp8_linear import Fp8Matrix

    path, refs = gpu_model
    hf = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    layers = 0
    for name, module in hf.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            loaded = module.weight.data.to(torch.bfloat16)
            module.weight.data = Fp8Matrix.quantize(loaded).dequantize()
            layers += 1
    assert layers == 4 * 7
    out = []
    with torch.no_grad():
        for ids, _, _ in refs:
            seq = hf.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )
            gen = seq[0, len(ids) :].tolist()
            out.append((ids, gen, hf(seq).logits[0, len(ids) - 1 :].float()))
    return path, out


def test_fp8_weights_on_cuda_match_the_dequantized_reference(fp8_refs):
    path, refs = fp8_refs
    prompts = [ids for ids, _, _ in refs]
    with engine(path, dtype="bfloat16", quantization="fp8") as e:
        out = e.generate(input_ids=prompts[0], sampling_params=SP)
        assert_greedy_equal(out["output_ids"], refs[0], "fp8 alone", BF16_NEAR_TIE)
        outs = e.generate(input_ids=prompts, sampling_params=SP)
        for i, out in enumerate(outs):
            assert_greedy_equal(out["output_ids"], refs[i], f"fp8 batch #{i}", BF16_NEAR_TIE)
        state = e.get_internal_state()
    graphs = state["cuda_graph"]
    assert graphs["captured"] and graphs["decode_steps"] > 0, graphs
